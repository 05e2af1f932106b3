"""Markdown tables, as the generated pages write them."""


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(columns: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(_cell(c) for c in columns) + " |",
            "| " + " | ".join("---" for _ in columns) + " |",
            *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows)]
