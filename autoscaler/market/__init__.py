"""Market data (data in, prices out): the price catalogue, spot price series and hazards."""
