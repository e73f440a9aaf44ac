"""The verdict of a scripts test made of named checks: each failed check
printed by name (with `context`, such as the text checked, when any failed),
then one closing line; 0 when all held, else 1."""


def report(test, checks, context=None):
    """test: the test's name; checks: (what, held) pairs."""
    failures = [what for what, held in checks if not held]
    for what in failures:
        print(f"FAILED: {what}")
    if failures:
        if context:
            print(context)
        print(f"{test}: {len(failures)} check(s) failed")
        return 1
    print(f"{test}: all checks passed")
    return 0
