"""Upkeep: store-wide work run on behalf of everyone, above the volumes and images it
tidies (floor 5 of tests/unit/test_layers.py; the daemon, the replica server and the
CLI run it).

    recovery.py   at start-up, roll back or finish what dead processes left half done
                  (phases), finish deletes, remove what gc would (unreferenced files)
    ephemeral.py  volumes with a grace period, removed by gc once unused for longer
    scrub.py      re-hash what the roots reach, name what holds the damage, heal it
                  from another store; scheduled.py runs it on `scrub.every`
"""
