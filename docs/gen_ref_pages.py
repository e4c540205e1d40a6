"""The API reference pages, written at `mkdocs build` time by mkdocs-gen-files: one page per public package of
elmo_tf, with every name of its `__all__` rendered from its docstring by mkdocstrings (`::: path`).

Each name is rendered once, under the module that defines it, on the page of the innermost package that exports it;
the other packages that export it (`elmo_tf.ELMo`) link there (`elmo_tf._reference` finds which is which).
"""

from pathlib import Path

from elmo_tf._reference import PACKAGES, reference_entries


def page(package, entries):
    lines = [
        f"# `{package}`",
        "",
        PACKAGES[package],
        "",
        f"::: {package}",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "",
    ]
    linked = [(name, path) for name, path, here in entries if not here]
    if linked:
        lines += ["Also exported here, documented where they are defined:", ""]
        lines += [f"- [`{name}`][{path}]" for name, path in linked] + [""]
    for _name, path, here in entries:
        if here:
            lines += [f"::: {path}", ""]
    return "\n".join(lines)


def command_help(argv):
    """What `elmo-tf ARGV --help` prints (argparse's help text, 110 columns wide)."""
    import contextlib
    import io
    import os

    from elmo_tf.cli.main import main as cli_main

    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli_main([*argv, "--help"])
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue()


def command_line_page():
    """The command-line reference: `elmo-tf --help` and every subcommand's `--help`, as the parsers print them."""
    from elmo_tf.cli.main import COMMANDS

    lines = [
        "# Command line",
        "",
        "Every subcommand's `--help`, as `elmo-tf` prints it (generated from the parsers "
        "when this site is built). The guides explain the jobs; [The command line](../cli.md) the contract every "
        "command keeps.",
        "",
        "## elmo-tf",
        "",
        "```text",
        command_help([]).rstrip(),
        "```",
        "",
    ]
    for name in COMMANDS:
        lines += [f"## elmo-tf {name}", "", "```text", command_help([name]).rstrip(), "```", ""]
    return "\n".join(lines)


def main():
    import mkdocs_gen_files

    nav = mkdocs_gen_files.Nav()
    for package, entries in reference_entries().items():
        rel = Path("reference", f"{package}.md")
        nav[package] = f"{package}.md"
        with mkdocs_gen_files.open(rel, "w") as f:
            f.write(page(package, entries))
    nav["command line"] = "command-line.md"
    with mkdocs_gen_files.open("reference/command-line.md", "w") as f:
        f.write(command_line_page())
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as f:
        f.writelines(nav.build_literate_nav())


if __name__ in {"__main__", "<run_path>"}:
    main()
