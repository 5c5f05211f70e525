"""`nasd serve --help` documents every long option `nasd serve` accepts: the options
declared in src/cli.rs (read as text, never built here) all appear in the help, and every
option the help names is accepted by the parser."""

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import REPO, default_binary  # noqa: E402

CLI_RS = REPO / "src" / "cli.rs"


def _serve_help() -> str:
    p = subprocess.run([str(default_binary()), "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _help_options(text: str) -> set:
    """Long options in the option list of the help (lines starting with -x, or --long)."""
    opts = set()
    for line in text.splitlines():
        m = re.match(r"\s*(?:-\w,\s*)?(--[a-z0-9][a-z0-9-]*)", line)
        if m:
            opts.add(m.group(1))
    return opts


def _struct_body(src: str, name: str) -> str:
    m = re.search(r"\bstruct\s+" + name + r"\s*\{", src)
    assert m, f"struct {name} not found in {CLI_RS}"
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    return src[m.end():i - 1]


def _cli_rs_long_options() -> set:
    """`--name` of every field of ServeArgs with an #[arg(long ...)] attribute (clap's
    default: the field name with '_' -> '-'; or `long = "name"`)."""
    body = _struct_body(CLI_RS.read_text(), "ServeArgs")
    assert "flatten" not in body, "ServeArgs flattens another struct: extend this parser"
    opts = set()
    attrs = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("#["):
            attrs.append(line)
            continue
        m = re.match(r"(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:", line)
        if not m:
            continue
        field = m.group(1)
        for a in attrs:
            if re.match(r"#\[(arg|clap)\(", a) and re.search(r"\blong\b", a):
                explicit = re.search(r"\blong\s*=\s*\"([^\"]+)\"", a)
                opts.add("--" + (explicit.group(1) if explicit else field.replace("_", "-")))
        attrs = []
    return opts


def test_cli_rs_parser_sees_the_known_options():
    """Guard for the parser below: it finds options we know are there."""
    opts = _cli_rs_long_options()
    assert {"--listen", "--exports", "--portmap-port", "--async", "--no-root-squash", "--drc-entries"} <= opts
    assert "--dir" not in opts and "--async-writes" not in opts
    assert len(opts) >= 20, sorted(opts)


def test_serve_help_mentions_every_long_option():
    help_text = _serve_help()
    documented = _help_options(help_text)
    declared = _cli_rs_long_options()
    missing = declared - documented
    assert not missing, f"options in src/cli.rs ServeArgs but not in `nasd serve --help`: {sorted(missing)}"
    extra = documented - declared - {"--help", "--version"}
    assert not extra, f"`nasd serve --help` names options src/cli.rs does not declare: {sorted(extra)}"


def test_every_option_in_help_is_accepted():
    """Each option the help names parses (no "unexpected argument"); nothing is served
    because no directory is given."""
    for opt in sorted(_help_options(_serve_help()) - {"--help", "--version"}):
        p = subprocess.run([str(default_binary()), "serve", opt], capture_output=True, text=True, timeout=30)
        assert "unexpected argument" not in p.stderr, f"{opt}: {p.stderr}"
        assert p.returncode != 0, f"`nasd serve {opt}` with nothing to serve must fail"
        assert opt in p.stderr or "nothing to serve" in p.stderr or "value is required" in p.stderr, \
            f"{opt}: {p.stderr}"
