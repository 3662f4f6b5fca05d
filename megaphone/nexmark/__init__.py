"""The NEXMark workload: persons, auctions and bids of an online auction house, and queries
over them on megaphone pipelines, whose state migrates while they run.

``generator.py`` makes the events, deterministically and in any range. ``queries.py`` runs
Q3 (local item suggestion: an unbounded join), Q4 (average closing price per category: each
auction's winning bid at its close, then a running average per category), Q5 (hot items per
sliding window), Q7 (highest bid per tumbling window) and Q8 (new users: a windowed join), one
epoch of generated events at a time; ``functions.py`` holds the per-key functions they need
beyond windows and joins (winning bids, running average, top of a window). ``sql.py`` computes
the same rows in Spark batch SQL, the reference the tests hold the streaming runs to;
``definitions.py`` holds what both share: the output rows, filters and window sizes.
"""
