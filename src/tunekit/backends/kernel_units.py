"""One kernel of a ``.cu`` file as its own translation unit, so NVRTC compiles only what a candidate
runs: a whole file instantiates dozens of kernels (seconds to compile), one kernel with the
templates it needs a fraction of a second (``docs/measurements.md``).

Each ``.cu`` of ``tunekit/kernels/cuda`` ends with its kernels' instantiations, written with
function-like macros (``TUNEKIT_FORMS(TUNEKIT_UNARY, silu, ...)`` expands into one
``extern "C" __global__`` definition per vector form), inside
``#ifndef TUNEKIT_SELECTED_KERNELS ... #endif``. Here the file's own macros are expanded (a small
preprocessor for exactly what these files use: ``#define NAME(params) body``, ``##`` pasting,
arguments expanded before substitution, the result rescanned; anything else it meets raises
:class:`UnitError` rather than guess) into every kernel's definition, by name. A kernel's unit is the
file's text with ``TUNEKIT_SELECTED_KERNELS`` defined (the templates and macros, no instantiation)
followed by that one definition, so it compiles to the same machine code as in the whole file.

A file without that section has no per-kernel units (:func:`definitions` returns None) and is
compiled whole. The source text and its hash stay the whole file's (:func:`tunekit.backends.nvrtc.source`).
"""

from __future__ import annotations

import functools
import pathlib
import re

from .nvrtc import source

__all__ = ["UnitError", "GUARD", "definitions", "kernel_names", "kernel_source", "expand"]

#: the macro that leaves a file's instantiations out
GUARD = "TUNEKIT_SELECTED_KERNELS"


class UnitError(ValueError):
    """A kernel source this expander cannot take apart exactly, or a kernel it does not define."""


_SECTION = re.compile(rf"^#ifndef {GUARD}\b[^\n]*\n(.*?)^#endif\b", re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', re.DOTALL)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)(.*)$", re.MULTILINE)
_TOKEN = re.compile(r'\s+|"(?:\\.|[^"\\\n])*"|\w+|##|.', re.DOTALL)


def _clean(text: str) -> str:
    """Lines spliced at backslash-newlines, comments replaced by a space (string literals kept)."""
    text = text.replace("\\\n", "")
    return _COMMENT.sub(lambda m: m.group(0) if m.group(0).startswith('"') else " ", text)


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _is_word(token: str) -> bool:
    return bool(token) and (token[0].isalnum() or token[0] == "_")


def _macros(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """The function-like macros ``#define``d in ``text`` (cleaned): name -> (params, body tokens)."""
    found = {}
    for name, params, body in _DEFINE.findall(text):
        names = [p.strip() for p in params.split(",")] if params.strip() else []
        if any(not re.fullmatch(r"[A-Za-z_]\w*", p) for p in names):
            raise UnitError(f"macro {name}: unsupported parameter list ({params})")
        found[name] = (names, _tokens(body.strip()))
    return found


def _next(tokens: list[str], i: int, step: int = 1) -> int:
    """The index of the first non-space token from ``i`` on in direction ``step`` (-1 or len past the end)."""
    while 0 <= i < len(tokens) and tokens[i].isspace():
        i += step
    return i


def _arguments(tokens: list[str], start: int, name: str) -> tuple[list[list[str]], int]:
    """The arguments of the call whose "(" is at ``start``; and the index after its ")"."""
    args, current, depth = [], [], 0
    for i in range(start + 1, len(tokens)):
        t = tokens[i]
        if t == "(":
            depth += 1
        elif t == ")" and depth == 0:
            args.append(current)
            return [_strip(a) for a in args], i + 1
        elif t == ")":
            depth -= 1
        elif t == "," and depth == 0:
            args.append(current)
            current = []
            continue
        current.append(t)
    raise UnitError(f"unterminated call of {name}")


def _strip(tokens: list[str]) -> list[str]:
    lo, hi = 0, len(tokens)
    while lo < hi and tokens[lo].isspace():
        lo += 1
    while hi > lo and tokens[hi - 1].isspace():
        hi -= 1
    return tokens[lo:hi]


def expand(tokens: list[str], macros: dict, active: frozenset = frozenset()) -> list[str]:
    """``tokens`` with every call of a function-like macro of ``macros`` replaced by its expansion."""
    out, i = [], 0
    while i < len(tokens):
        t = tokens[i]
        j = _next(tokens, i + 1)
        if t in macros and t not in active and j < len(tokens) and tokens[j] == "(":
            args, i = _arguments(tokens, j, t)
            out.extend(_replace(t, args, macros, active))
            continue
        out.append(t)
        i += 1
    return out


def _replace(name: str, args: list[list[str]], macros: dict, active: frozenset) -> list[str]:
    """One call of ``name``: parameters substituted (raw next to ``##``, else expanded), ``##``
    pasted, then rescanned with ``name`` disabled."""
    params, body = macros[name]
    if args == [[]] and not params:
        args = []
    if len(args) != len(params):
        raise UnitError(f"{name} takes {len(params)} arguments, got {len(args)}")
    raw = dict(zip(params, args))
    substituted = []
    for k, t in enumerate(body):
        if t == "#":
            raise UnitError(f"{name}: stringizing (#) is not supported")
        if t not in raw:
            substituted.append(t)
            continue
        before, after = _next(body, k - 1, -1), _next(body, k + 1)
        pasted = (before >= 0 and body[before] == "##") or (after < len(body) and body[after] == "##")
        if pasted and not raw[t]:
            raise UnitError(f"{name}: an empty argument next to ## is not supported")
        substituted.extend(raw[t] if pasted else expand(raw[t], macros, active))
    result = _rescan(_paste(substituted, name), name, macros, active)
    last = _next(result, len(result) - 1, -1)
    if last >= 0 and result[last] in macros and result[last] not in active | {name}:
        raise UnitError(f"{name}'s expansion ends in the macro name {result[last]}: not supported")
    return result


def _paste(tokens: list[str], name: str) -> list[str]:
    out: list[str] = []
    k = 0
    while k < len(tokens):
        if tokens[k] == "##":
            while out and out[-1].isspace():
                out.pop()
            k = _next(tokens, k + 1)
            if not out or k >= len(tokens):
                raise UnitError(f"{name}: ## at the edge of its body")
            joined = out.pop() + tokens[k]
            if len(_tokens(joined)) != 1:
                raise UnitError(f"{name}: pasting gave {joined!r}, not one token")
            out.append(joined)
        else:
            out.append(tokens[k])
        k += 1
    return out


def _rescan(tokens: list[str], name: str, macros: dict, active: frozenset) -> list[str]:
    return expand(tokens, macros, active | {name})


def _join(tokens: list[str]) -> str:
    """The text of ``tokens``: a run of spaces as one space (or newline), words kept apart."""
    out = []
    for t in tokens:
        if t.isspace():
            t = "\n" if "\n" in t else " "
        elif out and _is_word(out[-1][-1:]) and _is_word(t[:1]):
            out.append(" ")
        out.append(t)
    return "".join(out)


def _split_definitions(tokens: list[str], filename: str) -> dict[str, str]:
    """The ``extern "C"`` definitions in ``tokens`` (an expanded section), by kernel name."""
    found: dict[str, str] = {}
    i = _next(tokens, 0)
    while i < len(tokens):
        after = _next(tokens, i + 1)
        if tokens[i] != "extern" or after >= len(tokens) or tokens[after] != '"C"':
            raise UnitError(f"{filename}: unexpected {''.join(tokens[i:i + 8])!r} among the kernel definitions")
        depth, k, name = 0, i, None
        while k < len(tokens):
            t = tokens[k]
            if t == "{" and depth == 0 and name is None:
                head = _join(tokens[i:k])
                calls = list(re.finditer(r"(\w+)\s*\(", head))
                name = calls[-1].group(1) if calls else None
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        if name is None or depth != 0:
            raise UnitError(f"{filename}: an unfinished kernel definition")
        if name in found:
            raise UnitError(f"{filename}: kernel {name} defined twice")
        found[name] = _join(tokens[i:k + 1])
        i = _next(tokens, k + 1)
    return found


@functools.lru_cache(maxsize=None)
def definitions(filename: str) -> dict[str, str] | None:
    """Every kernel of ``filename``'s instantiation section, expanded: name -> its definition; None
    for a file without the section."""
    text = _clean(source(filename))
    section = _SECTION.search(text)
    if section is None:
        return None
    if re.search(r"^[ \t]*#", section.group(1), re.MULTILINE):
        raise UnitError(f"{filename}: preprocessor directives inside the {GUARD} section are not supported")
    body = expand(_tokens(section.group(1)), _macros(text[:section.start()]))
    return _split_definitions(body, filename)


def unit_identity(filename: str, name: str) -> str:
    """Text that determines :func:`kernel_source` (the file's source, the kernel's name and this
    module's own text, whose rules make the unit), without the 60 ms of preprocessing that makes it:
    what names the unit's cubin in the cache."""
    return f"{source(filename)}\0unit {name}\0{_own_text()}"


@functools.lru_cache(maxsize=None)
def _own_text() -> str:
    """This module's source (its rules make the units); tunekit's version where no source is
    installed (a sourceless or zipped install: a release's rules do not change)."""
    try:
        return pathlib.Path(__file__).read_text()
    except OSError:
        from .._version import __version__

        return f"tunekit {__version__}"


def kernel_names(filename: str) -> tuple[str, ...]:
    """The kernels ``filename`` defines, in order (empty for a file without the section)."""
    return tuple(definitions(filename) or ())


def kernel_source(filename: str, name: str) -> str:
    """The translation unit of kernel ``name`` alone: ``filename``'s text without its instantiations,
    then that kernel's definition. UnitError when the file has no such kernel (or no section)."""
    found = definitions(filename)
    if found is None or name not in found:
        known = ", ".join(found or ()) or f"none: no {GUARD} section"
        raise UnitError(f"{filename} defines no kernel {name} (its kernels: {known})")
    return f"#define {GUARD}\n{source(filename)}\n// ---- {name}, the one kernel of this unit ----\n{found[name]}\n"
