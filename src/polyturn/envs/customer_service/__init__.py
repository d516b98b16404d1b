"""``polyturn/CustomerService-v0``: customer service over an order database with a simulated customer."""

from polyturn.envs.customer_service.env import CustomerServiceEnv

__all__ = ["CustomerServiceEnv"]
