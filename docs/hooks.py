"""mkdocs hooks: pages generated from the code at build time (never committed). The
configuration reference is generated into the checkout instead (rul.reference.CONFIG_PAGE)."""

from mkdocs.structure.files import File

from rul.reference import cli_reference, odd_inputs_reference


def on_files(files, config):
    for page, content in (("reference/cli.md", cli_reference()),
                          ("reference/odd-inputs.md", odd_inputs_reference())):
        files.append(File.generated(config, page, content=content))
    return files
