"""Decisions (numbers in, plans out): the policies (``policy/``), the fleet view, sizing,
strategies, deadlines and bounds. Imports the model and the market, never the controller."""
