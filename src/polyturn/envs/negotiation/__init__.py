"""``polyturn/Negotiation-v0``: deal-or-no-deal bargaining with scripted opponents (see :mod:`.env`)."""
