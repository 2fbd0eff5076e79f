"""Stage behaviour tests: hand-computed scenarios for every stage of a lane (issue 13)."""
