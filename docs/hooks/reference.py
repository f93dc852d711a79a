"""MkDocs hook: the configuration and command-line references, generated at build time from the code.

Nothing here is written twice. ``docs/configuration.md`` holds a marker ``<!-- tops:config SECTION -->`` for every
table of the configuration schema (``stream.core.config.SCHEMA``, and ``streams.template`` for the stream template:
the fields of ``operators.ToPSConfig`` documented by ``TEMPLATE_DOCS``); ``docs/cli.md`` holds ``<!-- tops:cli-index
-->`` and a marker ``<!-- tops:cli COMMAND -->`` for every subcommand of ``stream.cli``. Each marker is replaced by a
table made from the schema or the argparse parser. A section or command without a marker, or a marker that names
none, stops the build with the reason, so the reference cannot fall behind the code.

Registered in ``mkdocs.yml`` (``hooks:``). ``config_page`` is also run by ``tests/core/test_config.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # build from a checkout without an install
    sys.path.insert(0, str(ROOT))

CONFIG_MARKER = re.compile(r"^<!-- tops:config (?P<name>[\w.]+) -->$", re.M)
CLI_MARKER = re.compile(r"^<!-- tops:cli (?P<name>[\w-]+) -->$", re.M)
CLI_INDEX = "<!-- tops:cli-index -->"
TEMPLATE = "streams.template"

KINDS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "strlist": "list of strings",
         "choice": "string"}


class PageMismatch(Exception):
    """A page and the code disagree (a section or command without its marker, or a marker naming none)."""


# -- values as they are written in TOML --------------------------------------------------------------------------
def toml_value(value: Any) -> str:
    """A default as it would be written in tops.toml; the build machine's home directory shown as ``~``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        home = str(Path.home())
        if home not in ("", "/") and value.startswith(home + "/"):
            value = "~" + value[len(home):]
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{value:.1f}"
    return str(value)


def cell(text: str) -> str:
    """Text for one cell of a Markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def allowed(field: Any) -> str:
    """The allowed values of a schema field: its choices, or its range."""
    choices = getattr(field, "choices", ())
    if choices:
        return ", ".join(f"`{c}`" for c in choices)
    low, high = getattr(field, "low", None), getattr(field, "high", None)
    if low is not None and high is not None:
        return f"{_number(low)} to {_number(high)}"
    if low is not None:
        return f"at least {_number(low)}"
    if high is not None:
        return f"at most {_number(high)}"
    if getattr(field, "kind", "") == "bool":
        return "`true`, `false`"
    return ""


# -- the configuration reference ---------------------------------------------------------------------------------
def render_config_section(name: str) -> str:
    """The table of one configuration section: every key's kind, default, allowed values and documentation."""
    from stream.core.config import SCHEMA

    if name == TEMPLATE:
        return render_template()
    if name not in SCHEMA:
        msg = f"configuration.md names a section [{name}] that the schema does not have (sections: {', '.join(SCHEMA)})"
        raise PageMismatch(msg)
    rows = ["| key | kind | default | allowed | meaning |", "|---|---|---|---|---|"]
    for key, field in SCHEMA[name].items():
        kind = KINDS.get(field.kind, field.kind)
        rows.append(f"| `{key}` | {kind} | `{cell(toml_value(field.default))}` | {cell(allowed(field))} "
                    f"| {cell(field.doc)} |")
    return "\n".join(rows)


def render_template() -> str:
    """The table of ``[streams.template]``: the fields of ``operators.ToPSConfig`` with ``TEMPLATE_DOCS``."""
    from operators.config import HOLDOUT_GRIDS, SELECTIONS, SMOOTHERS, ToPSConfig
    from stream.core.config import TEMPLATE_DOCS

    choices = {"smoother": SMOOTHERS, "selection": SELECTIONS, "holdout_grid": HOLDOUT_GRIDS}
    fields = {f.name: f for f in dataclasses.fields(ToPSConfig)}
    undocumented = [k for k in fields if k not in TEMPLATE_DOCS]
    unknown = [k for k in TEMPLATE_DOCS if k not in fields]
    if undocumented or unknown:
        msg = (f"[streams.template]: keys without documentation {undocumented}, documented keys that do not exist "
               f"{unknown}")
        raise PageMismatch(msg)
    rows = ["| key | kind | default | allowed | meaning |", "|---|---|---|---|---|"]
    for key, doc in TEMPLATE_DOCS.items():
        f = fields[key]
        type_text = str(f.type)
        kind = KINDS.get(type_text.split("|")[0].strip(), type_text)
        if f.default is dataclasses.MISSING:
            default = "required"
        elif f.default is None:
            default = "omitted"
        else:
            default = f"`{toml_value(f.default)}`"
        ok = ", ".join(f"`{c}`" for c in choices.get(key, ()))
        rows.append(f"| `{key}` | {kind} | {default} | {ok} | {cell(doc)} |")
    return "\n".join(rows)


def config_page(markdown: str) -> str:
    """Replace every configuration marker; every section of the schema must have one."""
    from stream.core.config import SCHEMA

    named = CONFIG_MARKER.findall(markdown)
    missing = [s for s in [*SCHEMA, TEMPLATE] if s not in named]
    if missing:
        msg = f"configuration.md has no marker for {', '.join(f'[{s}]' for s in missing)}"
        raise PageMismatch(msg)
    return CONFIG_MARKER.sub(lambda m: render_config_section(m.group("name")), markdown)


# -- the command-line reference ----------------------------------------------------------------------------------
def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {"default": action.default, "prog": "", "dest": action.dest}
    return cell(text)


def _option(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        metavar = action.metavar
        if metavar is None and action.choices is not None:
            metavar = "{" + ",".join(map(str, action.choices)) + "}"
        metavar = " " + (metavar or action.dest.upper())
    return ", ".join(f"`{o}{metavar}`" for o in action.option_strings)


def render_command(name: str) -> str:
    """Usage, description and one table per argument group of ``tops NAME``, from its argparse parser."""
    from stream.cli import COMMANDS, build_parser

    if name not in COMMANDS:
        msg = f"cli.md names a command {name!r} that tops does not have (commands: {', '.join(COMMANDS)})"
        raise PageMismatch(msg)
    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[name]
    fmt = argparse.HelpFormatter(prog=p.prog, width=100)
    fmt.add_usage(p.usage, p._actions, p._mutually_exclusive_groups, prefix="")
    summary = cell(COMMANDS[name][1])
    out = [summary[:1].upper() + summary[1:] + ".", "", "```text", fmt.format_help().strip(), "```"]
    for group in p._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = {"positional arguments": "Arguments", "options": "Options"}.get(group.title or "", group.title or "")
        out += ["", f"**{cell(title[:1].upper() + title[1:])}**", "", "| argument | meaning |", "|---|---|"]
        out += [f"| {_option(a)} | {_help(a)} |" for a in actions]
    return "\n".join(out)


def render_index() -> str:
    """One row per subcommand: its name, linked to its section, and its one-line help."""
    from stream.cli import COMMANDS

    rows = ["| command | what it does |", "|---|---|"]
    rows += [f"| [`tops {name}`](#tops-{name}) | {cell(help_text)} |"
             for name, (_, help_text) in COMMANDS.items()]
    return "\n".join(rows)


def cli_page(markdown: str) -> str:
    """Replace the index marker and every command marker; every subcommand of ``tops`` must have one."""
    from stream.cli import COMMANDS

    named = CLI_MARKER.findall(markdown)
    missing = [c for c in COMMANDS if c not in named]
    if missing:
        msg = f"cli.md has no marker for tops {', '.join(missing)}"
        raise PageMismatch(msg)
    markdown = markdown.replace(CLI_INDEX, render_index())
    return CLI_MARKER.sub(lambda m: render_command(m.group("name")), markdown)


# -- the MkDocs event --------------------------------------------------------------------------------------------
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    if src == "configuration.md":
        return config_page(markdown)
    if src == "cli.md":
        return cli_page(markdown)
    return markdown
