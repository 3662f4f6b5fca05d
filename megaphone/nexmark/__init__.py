"""The NEXMark workload: persons, auctions and bids of an online auction house.

``generator.py`` makes the events, deterministically and in any range; the queries (Q3, Q4,
Q5, Q7, Q8) will follow with the window and join operators they need.
"""
