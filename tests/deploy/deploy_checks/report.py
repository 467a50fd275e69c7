"""What the checks found: each problem is one output line (and makes the run fail), each note
says which check was skipped or which tool ran."""

PROBLEMS = []
NOTES = []


def problem(path, msg):
    PROBLEMS.append(f"{path}: {msg}")


def note(msg):
    NOTES.append(f"validate_deploy: {msg}")
