"""The agents run, Jepsen's shape: sessions (generator), the nemesis, the driver (interpreter),
the run's config, progress and composition root, and the run's watch of its servers. Imports
every room below it; only cli/, modes/ and locust/ import it.
"""
