"""Store-wide work run on behalf of everyone: scrub (re-hash what the roots reach, name
what holds the damage, heal it from another store)."""
