"""The modes beside `agents`: proxy (a user's own agent audited live), replay (a capture sent
again), audit (captured traffic judged offline), sweep (where corruption starts). Import any
room below them; never each other's CLI.
"""
