"""Cost reports people can read, from a :class:`~autoscaler.accounting.costs.CostRecord`.

- :mod:`~autoscaler.accounting.report.rows`: the report's tables (summary, per job, per offering and
  market) as formatted rows, shared by every output;
- :mod:`~autoscaler.accounting.report.tables`: rich terminal tables;
- :mod:`~autoscaler.accounting.report.export`: CSV files (one per table, plus the time series) and a
  JSON summary;
- :mod:`~autoscaler.accounting.report.html`: one self-contained HTML page with the tables and three
  plots;
- :mod:`~autoscaler.accounting.report.source`: finding cost records in JSON files (a record, a
  simulation result holding one, or a list of results).

Dollar figures are rounded only here, at report time, with the precision the amount needs
(:func:`autoscaler.accounting.costs.usd_for_display`); the total is also given to the cent
(:func:`autoscaler.accounting.costs.usd_to_cents`).
"""
