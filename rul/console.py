"""What a command prints besides its results: warnings as one line of rul's own.

Python shows a warning as `file:line: Category: message` followed by the line of source that
raised it, which tells a user nothing they can act on. The command line shows each as
`warning: message` (its first line), once per message, on stderr. Libraries' warnings come
through the same way: a real one still reaches the user, without the source line.
"""

import sys
import warnings

_shown: set[str] = set()


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    if text in _shown:
        return
    _shown.add(text)
    print(f"warning: {text}", file=file or sys.stderr)


def one_line_warnings() -> None:
    """Show warnings as `show_warning` does, for the rest of the process."""
    warnings.showwarning = show_warning
