"""``prb run``'s orchestration: the stages planned, checked and run in order
(``orchestrate``), and a run's summary (``runsummary``)."""
