"""The one registry of options (`spark_qtransport.options.registry`): each option parsed and bounded
as it says, one name per settings field, every flag it names a real flag of the command line, and no
option name spelled below the front ends (the transport and the dialects name settings fields)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import click
import pytest

from spark_qtransport.cli import main
from spark_qtransport.dialects import dialect_named
from spark_qtransport.errors import ConfigError, QueueNotFoundError, field_error
from spark_qtransport.options import registry as r
from spark_qtransport.options.parse import ReaderOptions, WriterOptions
from spark_qtransport.transport.settings import ReceiveSettings, SendSettings, StreamSettings

PACKAGE = Path(__file__).resolve().parent.parent / "spark_qtransport"
URL = "postgresql://app@127.0.0.1:5432/db"
BOUNDED = [o for o in r.REGISTRY if o.kind in (r.INT, r.DURATION) and (o.minimum is not None or o.maximum is not None)]
#: fields that are not one settings attribute: parts of the URL, of the allow-list, of the delayed rule, of the selection
COMPOSITE = {"url", "outage_timeout", "response_timeout", "allowed_schemas", "allowed_queues", "delayed_table",
             "delayed_suffix", "queue_pattern"}


def test_the_registry_is_consistent() -> None:
    assert list(r._check_registry()) == []


def test_a_settings_field_has_one_option_name() -> None:
    names: dict[str, set[str]] = {}
    for o in r.REGISTRY:
        if o.field:
            names.setdefault(o.field, set()).add(o.name)
    assert {f: n for f, n in names.items() if len(n) > 1} == {}


def test_each_field_is_a_field_of_the_settings() -> None:
    fields = {f.name for cls in (ReceiveSettings, SendSettings, StreamSettings) for f in dataclasses.fields(cls)}
    missing = {o.field for o in r.REGISTRY if o.field and o.field not in fields} - COMPOSITE
    assert missing == set()


@pytest.mark.parametrize("option", BOUNDED, ids=lambda o: f"{o.name}-{sorted(o.applies)[0]}")
def test_the_bounds_are_kept_and_the_errors_name_the_option(option: r.Option) -> None:
    unit = "s" if option.kind == r.DURATION else ""
    if option.minimum is not None and option.minimum > 0:
        low = option.minimum / 2 if option.kind == r.DURATION else option.minimum - 1
        with pytest.raises(ConfigError, match=rf"^option '{option.name}' must be at least ") as failed:
            option.parse(f"{low}{unit}")
        assert failed.value.option == option.name
        assert option.parse(f"{option.minimum}{unit}") == option.minimum
    if option.maximum is not None:
        with pytest.raises(ConfigError, match=rf"^option '{option.name}' must be at most "):
            option.parse(f"{int(option.maximum) + 1}{unit}")
        assert option.parse(f"{int(option.maximum)}{unit}") == option.maximum


def test_the_flag_form_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--prepared-timeout must be at most 1d, not 2d$") as failed:
        r.flag("--prepared-timeout").parse("2d", flag=True)
    assert failed.value.option == "--prepared-timeout"


def _flags(command: click.Command) -> set[str]:
    return {o for _, p in _params(command) for o in getattr(p, "opts", ()) if o.startswith("--")}


def test_every_flag_the_registry_names_is_a_flag_of_the_command_line() -> None:
    flags = {o.cli for o in r.REGISTRY if o.cli}
    assert flags and flags <= _flags(main), flags - _flags(main)


def _params(command: click.Command, path: str = "sqlqueue") -> list[tuple[str, click.Parameter]]:
    found = [(path, p) for p in command.params]
    for name, sub in getattr(command, "commands", {}).items():
        found += _params(sub, f"{path} {name}")
    return found


def _kebab(name: str) -> str:
    return "--" + re.sub(r"[A-Z]", lambda m: "-" + m[0].lower(), name)


#: flags that take an option's value under another name: `sqlqueue error list --queue` is an error queue
_ALIASES = {("error", "--queue"): "errorQueue"}


def test_a_flag_that_takes_an_option_defaults_as_the_option_does() -> None:
    """The other direction: a flag of the command line that is an option's (`--error-queue` for
    `errorQueue`, or one the registry names) has no default of its own. (Planted: `sqlqueue send
    --error-queue` defaulting to "errors" fails this.)"""
    options = {_kebab(o.name): o for o in r.REGISTRY if o.default is not None}
    options |= {o.cli: o for o in r.REGISTRY if o.cli and o.default is not None}
    checked, wrong = 0, []
    for path, param in _params(main):
        for flag in (f for f in getattr(param, "opts", ()) if f.startswith("--")):
            alias = _ALIASES.get((path.split(" ")[1] if " " in path else "", flag))
            option = options.get(_kebab(alias) if alias else flag)
            if option is None or not isinstance(param.default, (str, int, float, bool)):
                continue  # no option, or no default of the flag's own
            checked += 1
            if param.default != option.default and param.default != option.shown:
                wrong.append(f"{path} {flag}: {param.default!r}, the option {option.name!r}: {option.default!r}")
    assert checked >= 4, "the check found the flags it is about (--error-queue of send, move-delayed, ddl)"
    assert wrong == []


#: flags named like an option that mean something else, and why
_UNLIKE = {
    ("ddl", "--queue"): "the queue whose DDL is printed",
    ("ddl", "--destination"): "queues a sending endpoint sends to (repeatable), for its grants",
    ("send", "--create-queues"): "an on/off switch, as the option createQueues is true or false",
    ("subscribe", "--endpoint"): "the subscribing endpoint, not the sender",
    ("unsubscribe", "--endpoint"): "the subscribing endpoint, not the sender",
}


def test_every_flag_that_takes_an_option_is_the_registry_s() -> None:
    """A flag named like an option (or one of `_ALIASES`) is made by `cli.app.registered` from the
    registry's entry (its help names the option; its default, env and errors are the option's), so
    the option's default is written once: `--error-queue`'s "error" was written in four places."""
    named = {_kebab(o.name) for o in r.REGISTRY} | {o.cli for o in r.REGISTRY if o.cli}
    made_here, registered = [], 0
    for path, param in _params(main):
        command = path.split(" ")[1] if " " in path else ""
        for flag in (f for f in getattr(param, "opts", ()) if f.startswith("--")):
            if (flag in named or (command, flag) in _ALIASES) and (command, flag) not in _UNLIKE:
                if "(the option " in (getattr(param, "help", None) or ""):
                    registered += 1
                else:
                    made_here.append(f"{path} {flag}")
    assert made_here == []
    assert registered >= 40


def test_a_field_error_is_named_by_each_front_end() -> None:
    exc = field_error("error_queue", "queue X does not exist; create it (or set `create_queues`)", kind=QueueNotFoundError)
    assert exc.message.startswith("error_queue: ") and exc.field == "error_queue" and exc.option is None
    spark = r.name_fields(exc)
    assert spark.message == "option 'errorQueue': queue X does not exist; create it (or set option 'createQueues')"
    assert type(spark) is QueueNotFoundError and spark.option == "errorQueue" and spark.field == "error_queue"
    cli = r.name_fields(exc, cli={"create_queues": "--create-queues", "error_queue": "--error-queue"})
    assert cli.message == "--error-queue: queue X does not exist; create it (or set --create-queues)"
    assert r.name_fields(field_error("queue", "is empty")).message == "option 'queue' is empty"
    assert r.name_fields(spark) is spark  # named once


def test_the_front_ends_name_what_the_transport_raises() -> None:
    """A check the settings make (below the options) fails naming the option through the source."""
    with pytest.raises(ConfigError, match="^option 'errorQueue' must name another queue than option 'queue'$") as failed:
        ReaderOptions.parse({"url": URL, "queue": "Sales", "errorQueue": "Sales"})
    assert failed.value.field == "error_queue" and failed.value.option == "errorQueue"
    with pytest.raises(ConfigError, match="^option 'delayedTable': .* is option 'errorQueue', not a delayed table"):
        WriterOptions.parse({"url": URL, "endpoint": "Sales", "delayedTable": "error"})


# -- no option name below the front ends ----------------------------------------------------------

_NAMES = {o.name for o in r.REGISTRY} | {o.cli for o in r.REGISTRY if o.cli}
_SPELLED = re.compile(r"option '([A-Za-z-]+)'|\.option\('([A-Za-z]+)'")


def _lower_layers() -> list[Path]:
    return sorted(p for room in ("transport", "dialects") for p in (PACKAGE / room).rglob("*.py"))


@pytest.mark.parametrize("path", _lower_layers(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_transport_and_the_dialects_spell_no_option_name_in_an_error(path: Path) -> None:
    """`option="errorQueue"`, ``option 'errorQueue'`` or ``.option('createQueues', ...)`` below the
    front ends: the transport raises naming a settings field (`errors.field_error`) instead."""
    wrong = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "option" and isinstance(node.value, ast.Constant):
            if node.value.value in _NAMES:
                wrong.append(f"line {node.lineno}: option={node.value.value!r}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in _SPELLED.finditer(node.value):
                if (m[1] or m[2]) in _NAMES:
                    wrong.append(f"line {node.lineno}: {m[0]}")
    assert wrong == []


def _sample(o: r.Option) -> str:
    """A value of option `o` other than its default, within its bounds."""
    if o.kind == r.INT:
        return str(int(o.minimum or 0) + 7)
    if o.kind == r.DURATION:
        return str(int(o.minimum or 0) + 7)
    if o.kind == r.BOOL:
        return "false" if o.default else "true"
    if o.kind == r.CHOICE:
        return next(c for c in o.choices if c != o.default)
    if o.kind == r.ADDRESS:
        return '"s"."Sample"'
    return "Sample"


@pytest.mark.parametrize(("side", "into", "given"), [
    (r.READ, ReceiveSettings, {"url": URL, "queue": "Sales"}),
    (r.READ, StreamSettings, {"url": URL, "queue": "Sales"}),
    (r.WRITE, SendSettings, {"url": URL, "endpoint": "Sales"}),
], ids=["receive", "stream", "send"])
def test_each_option_sets_the_settings_field_it_names(side: str, into: type, given: dict[str, str]) -> None:
    """Every option whose field is a field of the settings (but for those made of several options) is
    read into it: a value given for it is the value the settings hold."""
    d = dialect_named("postgres")
    fields = {f.name for f in dataclasses.fields(into)} - COMPOSITE - {"queue", "consumer"}
    options = [o for o in r.for_side(side).values() if o.field in fields and o.key not in {k.lower() for k in given}]
    assert len(options) >= 3
    for o in options:
        value = o.parse(_sample(o), dialect=d)
        assert value != o.parse(None, dialect=d), o.name
        if side == r.WRITE:
            settings = WriterOptions.parse({**given, o.name: _sample(o)})
        elif into is StreamSettings:
            settings = ReaderOptions.stream({**given, o.name: _sample(o)})
        else:
            settings = ReaderOptions.parse({**given, o.name: _sample(o)})
        assert getattr(settings, o.field) == value, o.name


@pytest.mark.parametrize("option", [o for o in r.REGISTRY if o.kind == r.ADDRESS], ids=lambda o: f"{o.name}-{sorted(o.applies)[0]}")
def test_a_queue_address_given_blank_is_its_default_none_or_an_error_naming_it(option: r.Option) -> None:
    d = dialect_named("postgres")
    for blank in ("", "   "):
        if option.blank_is_none:
            assert option.parse(blank, dialect=d) is None
        elif option.default is not None:
            assert option.parse(blank, dialect=d) == d.parse_address(option.default)
        else:
            with pytest.raises(ConfigError, match=f"option '{option.name}'") as info:
                option.parse(blank, dialect=d)
            assert info.value.option == option.name
    assert option.parse('"s"."Q"', dialect=d) == d.parse_address('"s"."Q"')
    with pytest.raises(TypeError, match="dialect"):
        option.parse("Q")
