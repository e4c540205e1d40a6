"""A griffe extension of this site: reads elmo_tf's docstrings as the package writes them.

elmo_tf's docstrings use Google-style sections (`Args:`, Keras' `Call arguments:`, `Returns:`, `Example:`) that
follow each other without blank lines, and `Call arguments:` is not a section griffe knows. Griffe takes a section
only after a blank line, and would render the rest as one paragraph; so before a docstring is parsed, a blank line
goes above each section title, and `Call arguments:` becomes griffe's "Other parameters" section under its own title
(rendered as a table).
"""

import re

import griffe

SECTION = re.compile(
    r"^(Args|Arguments|Call arguments|Returns|Yields|Raises|Example|Examples|Attributes|Note|Notes|Warning):\s*$"
)


def normalize(text):
    """The docstring `text` with a blank line above each section title, `Call arguments:` as an "Other parameters"
    section titled "Call arguments"."""
    lines = text.split("\n")
    out = []
    in_fence = False
    for line in lines:
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else SECTION.match(line)
        if match:
            if out and out[-1].strip():
                out.append("")
            if match.group(1) == "Call arguments":
                line = "Other parameters: Call arguments"
        out.append(line)
    return "\n".join(out)


class DocstringSections(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = normalize(obj.docstring.value)
