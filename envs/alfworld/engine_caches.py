"""Process-wide memo tables that make the textworld engine cheaper without changing what it computes
(measured in bench/env_speed.py, bench/train_speed.py): the PDDL -> SAS translation of a problem (done
twice per reset by ``PddlState``; also stored in ``$ALFWORLD_DATA/translations``, one file per problem,
so that every process and run of this machine translates a game once: an evaluation of 306 games spent
a quarter of its time translating them again), the parse of a game's logic document (its actions and grammar,
parsed at every load: the N slots of a group load the same game), the parse of grammar strings and
the parse of grammar conditions (textworld parses every rule text and every condition with tatsu on
each derivation). All are keyed on their full input text. Another shortcut copies derivation
contexts shallowly (textworld deep-copies the entities of every context it forks, though the grammar
only reads them). Installed on import; :func:`install_engine_caches` turns them on or off.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import os
import pickle
import sys
import tempfile

os.environ.setdefault("ALFWORLD_DATA", os.path.abspath(os.path.join("runs", "alfworld_data")))

import fast_downward  # noqa: E402
import textworld.envs.pddl.logic as _pddl_logic  # noqa: E402
import textworld.envs.pddl.textgen as _textgen  # noqa: E402

_pddl2sas = fast_downward.pddl2sas
_parse_and_convert = _textgen._parse_and_convert
_logic_parse = _pddl_logic._parse_and_convert


_TRANSLATOR = importlib.metadata.version("fast-downward-textworld")
_translations: str | None = None  # folder of stored translations (install_engine_caches), None: none


@functools.lru_cache(maxsize=64)
def _cached_pddl2sas(domain: str, problem: str, verbose: bool, optimize: bool):
    path = None if verbose or _translations is None else _translation_file(domain, problem, optimize)
    if path is not None:
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception:  # noqa: BLE001 -- none yet, or a broken one: translate (and replace it)
            pass
    argv = sys.argv[:]
    try:
        translation = _pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
    finally:
        sys.argv[:] = argv  # the translator overwrites sys.argv
    if path is not None:
        _store(path, translation)
    return translation


def _translation_file(domain: str, problem: str, optimize: bool) -> str:
    """The stored translation's file: keyed on the translator's version and the full input."""
    key = hashlib.sha256("\0".join((_TRANSLATOR, str(optimize), domain, problem)).encode()).hexdigest()
    return os.path.join(_translations, f"{key}.pkl")


def _store(path: str, translation) -> None:
    """Write ``translation`` to ``path`` whole or not at all (a temporary file renamed: processes that
    translate one problem at once each write a complete file); a full or read-only disk only costs the
    next process a translation."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(translation, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _pddl2sas_memo(domain, problem, verbose=False, optimize=False):
    return _cached_pddl2sas(domain, problem, verbose, optimize)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str, rule_name: str):
    return _parse_and_convert(text, rule_name=rule_name)


def _parse_memo(text, rule_name="symbols", **kwargs):
    if kwargs.get("trace"):
        return _parse_and_convert(text, rule_name=rule_name, **kwargs)
    return copy.deepcopy(_parse_cached(text, rule_name))  # callers attach contexts to the symbols


@functools.lru_cache(maxsize=64)
def _logic_cached(text: str, rule_name: str):
    return _logic_parse(text, rule_name=rule_name)


def _logic_memo(text, rule_name="pddlStart", **kwargs):
    """The parse of a game's logic document (its actions and grammar), once per game text: the N
    slots of a group load the same game."""
    if kwargs:
        return _logic_parse(text, rule_name=rule_name, **kwargs)
    return copy.deepcopy(_logic_cached(text, rule_name))  # GameLogic keeps (and may change) what it gets


_parse_query = _textgen.Rule.parse_conjunctive_query.__func__


@functools.lru_cache(maxsize=4096)
def _query_cached(expr: str):
    return _parse_query(_textgen.Rule, expr)


def _query_memo(cls, expr):
    return _query_cached(expr)  # Rule objects are only read by State.all_assignments


_copy_context = _textgen.copy_context


def _copy_context_shallow(context):
    """textgen.copy_context without its deep copies of the variables and the mapping: the grammar
    only reads the entities and mapping values ({o.name}-style attribute access; State.all_assignments)
    and a copy's two dicts only get new keys (textgen.query), so every derived text is the same."""
    return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}


_REUSE_ENGINES = True  # GameEnv._load: load the next game into the slot's engine (install_engine_caches)


def reuse_engines() -> bool:
    """Whether a slot loads its next game into its engine (:func:`install_engine_caches` ``reuse``)."""
    return _REUSE_ENGINES


def install_engine_caches(enabled: bool = True, grammar: bool | None = None, reuse: bool | None = None,
                          translations: str | None = "") -> None:
    """Memo tables on (``enabled``) or off; ``grammar`` (default: ``enabled``) for the two grammar
    shortcuts alone: the condition-parse memo and the shallow derivation-context copies; ``reuse``
    (default: ``enabled``) for cheaper game loads: a slot loads its next game into its engine instead
    of starting a new one, and a game's logic document is parsed once (the logic memo);
    ``translations``: the folder of stored translations ("": ``$ALFWORLD_DATA/translations``, None:
    translations are kept in this process only)."""
    global _REUSE_ENGINES, _translations
    _translations = os.path.join(os.environ["ALFWORLD_DATA"], "translations") if translations == "" else translations
    _cached_pddl2sas.cache_clear()
    fast_downward.pddl2sas = _pddl2sas_memo if enabled else _pddl2sas
    _textgen._parse_and_convert = _parse_memo if enabled else _parse_and_convert
    grammar = enabled if grammar is None else grammar
    _textgen.Rule.parse_conjunctive_query = classmethod(_query_memo if grammar else _parse_query)
    _textgen.copy_context = _copy_context_shallow if grammar else _copy_context
    _REUSE_ENGINES = enabled if reuse is None else reuse
    _pddl_logic._parse_and_convert = _logic_memo if _REUSE_ENGINES else _logic_parse


install_engine_caches()
