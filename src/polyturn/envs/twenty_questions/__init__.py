"""``polyturn/TwentyQuestions-v0``: yes/no questions to a knowledge-base oracle (see :mod:`.env`)."""
