"""Start a program with arguments that its command line (/proc/PID/cmdline, `ps`) does not show.

tritonserver takes its restricted-API key only as an argument, and any user of the machine can read any
process's command line. So the child is started traced (PTRACE_TRACEME) and stops at its exec, before any of its
own code runs. Each secret argument travels in its environment block instead, which only its owner and root can
read; the argv pointer of the placeholder is pointed at that copy, and the entry is taken out of the environment
array, so that nothing the program starts (the python stubs) inherits it. Then it is let go. The command line keeps
a placeholder that no program accepts: if anything goes wrong the start fails, it never runs with a known value.
Standard library only; Linux, 64-bit.
"""
from __future__ import annotations

import ctypes
import os
import struct
import subprocess
from pathlib import Path
from typing import Callable

PTRACE_TRACEME = 0
PTRACE_DETACH = 17
PLACEHOLDER = "--s2t-hidden-argument"
ENV_PREFIX = "S2T_HIDDEN_ARGUMENT_"
WORD = 8


class HiddenArgumentError(RuntimeError):
    pass


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    return libc


def _read_string(mem, address: int, limit: int = 1 << 16) -> bytes:
    mem.seek(address)
    data = mem.read(limit)
    return data[:data.index(b"\0")]


def _words(mem, address: int, count: int) -> list[int]:
    mem.seek(address)
    return list(struct.unpack(f"<{count}Q", mem.read(count * WORD)))


def _null_terminated(mem, address: int) -> list[int]:
    pointers = []
    while True:
        (value,) = _words(mem, address + len(pointers) * WORD, 1)
        if value == 0:
            return pointers
        pointers.append(value)


def _rewire(pid: int, secrets: dict[int, str]) -> None:
    """In the stopped child: argv[i] -> the value of ENV_PREFIX<i> in its environment block; those entries out of
    the environment array. At the exec stop the stack holds argc, argv[], NULL, envp[], NULL, auxv."""
    start_stack = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[25])
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        (argc,) = _words(mem, start_stack, 1)
        argv_at = start_stack + WORD
        envp_at = argv_at + (argc + 1) * WORD
        envp = _null_terminated(mem, envp_at)
        kept, found = [], {}
        for pointer in envp:
            name, _, _ = _read_string(mem, pointer).partition(b"=")
            if name.startswith(ENV_PREFIX.encode()):
                found[int(name[len(ENV_PREFIX):])] = pointer + len(name) + 1
            else:
                kept.append(pointer)
        if set(found) != set(secrets):
            raise HiddenArgumentError(f"expected hidden arguments {sorted(secrets)}, found {sorted(found)}")
        for index, pointer in found.items():
            mem.seek(argv_at + index * WORD)
            mem.write(struct.pack("<Q", pointer))
        if not kept:
            raise HiddenArgumentError("the environment holds nothing but hidden arguments")
        # The array keeps its length: the auxiliary vector that the dynamic loader reads starts right after its
        # NULL. A freed slot repeats the last kept entry (a duplicate is harmless: getenv returns the first).
        mem.seek(envp_at)
        mem.write(struct.pack(f"<{len(envp)}Q", *kept, *([kept[-1]] * (len(envp) - len(kept)))))


def popen(command: list[str], secret_indices: set[int], env: dict[str, str],
          preexec_fn: Callable[[], None] | None = None, **kwargs) -> subprocess.Popen:
    """subprocess.Popen(command, ...), with command[i] for i in secret_indices kept off the command line."""
    if not secret_indices:
        return subprocess.Popen(command, env=env, preexec_fn=preexec_fn, **kwargs)
    if struct.calcsize("P") != WORD:
        raise HiddenArgumentError("hidden arguments need a 64-bit platform")
    shown = [PLACEHOLDER if i in secret_indices else arg for i, arg in enumerate(command)]
    env = {**{k: v for k, v in env.items() if not k.startswith(ENV_PREFIX)},
           **{f"{ENV_PREFIX}{i}": command[i] for i in secret_indices}}
    libc = _libc()

    def trace_me():
        if preexec_fn is not None:
            preexec_fn()
        if libc.ptrace(PTRACE_TRACEME, 0, None, None) != 0:
            raise OSError(ctypes.get_errno(), "ptrace(PTRACE_TRACEME) refused")

    try:
        process = subprocess.Popen(shown, env=env, preexec_fn=trace_me, **kwargs)
    except subprocess.SubprocessError as err:
        # Where ptrace is forbidden (a seccomp profile without it, Yama ptrace_scope 3) the key cannot be hidden.
        raise HiddenArgumentError(f"cannot start {command[0]} with its admin key kept off the command line: "
                                  f"ptrace(PTRACE_TRACEME) was refused ({err})") from None
    try:
        _, status = os.waitpid(process.pid, 0)
        if not os.WIFSTOPPED(status):
            raise HiddenArgumentError(f"{command[0]} did not stop at its start (status {status})")
        _rewire(process.pid, {i: command[i] for i in secret_indices})
    except BaseException:
        process.kill()
        libc.ptrace(PTRACE_DETACH, process.pid, None, None)
        process.wait()
        raise
    if libc.ptrace(PTRACE_DETACH, process.pid, None, None) != 0:
        process.kill()
        process.wait()
        raise HiddenArgumentError(f"could not let {command[0]} go (errno {ctypes.get_errno()})")
    return process
