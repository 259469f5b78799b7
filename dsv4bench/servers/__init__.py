"""The servers: what each kind offers, its metrics dialect, roles and discovery, monitors,
canaries, the wedge detector, and the probe and watch commands. Imports history, wire,
families and the terminal's escaping; never the harness (tests/test_rooms.py holds the
directions of every room).
"""
