"""ProgramState (what a program's `s` is) and ProgramStateGroup (what s.fork(n) returns)."""

import asyncio
from contextlib import contextmanager
from typing import Callable

from vlserve.lang.executor import StreamExecutor
from vlserve.lang.ir import (SglConcateAndAppend, SglExpr, SglExprList, SglRoleBegin, SglRoleEnd, SglVarScopeBegin,
                             SglVarScopeEnd)


class ProgramState:
    def __init__(self, stream_executor: StreamExecutor):
        self.stream_executor = stream_executor

    # ---- statements ----------------------------------------------------------------------------
    def __iadd__(self, other):
        if other is None:
            raise ValueError("tried to append None to a program state")
        self.stream_executor.submit(other)
        return self

    def _role(self, name: str, expr=None):
        """With expr: submits the role around it and returns that expression (as SGLang's does);
        without: a context manager for a role whose content is appended inside it."""
        if expr is not None:
            role_expr = SglExprList([SglRoleBegin(name), expr, SglRoleEnd(name)])
            self.stream_executor.submit(role_expr)
            return role_expr
        return self._role_scope(name)

    @contextmanager
    def _role_scope(self, name: str):
        self.stream_executor.submit(SglRoleBegin(name))
        yield
        self.stream_executor.submit(SglRoleEnd(name))

    def system(self, expr=None):
        return self._role("system", expr)

    def user(self, expr=None):
        return self._role("user", expr)

    def assistant(self, expr=None):
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str):
        self.stream_executor.submit(SglVarScopeBegin(name))
        yield
        self.stream_executor.submit(SglVarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: list[int] | None = None) -> "ProgramStateGroup":
        _refuse_position_ids_offset(position_ids_offset)
        return ProgramStateGroup([ProgramState(e) for e in self.stream_executor.fork(size)], self)

    @contextmanager
    def copy(self, position_ids_offset: list[int] | None = None):
        _refuse_position_ids_offset(position_ids_offset)
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    # ---- reading -------------------------------------------------------------------------------
    def text(self) -> str:
        return self.stream_executor.text()

    def messages(self) -> list[dict]:
        return self.stream_executor.messages()

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self):
        return self.stream_executor.error()

    def get_var(self, name: str):
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: str):
        return self.stream_executor.get_meta_info(name)

    def __getitem__(self, name: str):
        return self.get_var(name)

    def __setitem__(self, name: str, value) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"

    # ---- streaming -----------------------------------------------------------------------------
    def text_iter(self, var_name: str | None = None):
        """Yields the text (or one variable) as it grows; joined, the pieces equal text() (the variable)."""
        exe = self.stream_executor
        if not exe.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        prev = 0
        while True:
            piece, done = _next_piece(exe, var_name, prev)
            prev += len(piece)
            if piece:
                yield piece
            if done:
                exe._raise_error()
                return

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False):
        """text_iter for `async for`: each wait runs in a thread, never on the event loop. With
        return_meta_data (and a variable), each piece comes as (piece, the variable's meta_info so far)."""
        pieces, done = self.text_iter(var_name), object()
        while (piece := await asyncio.to_thread(next, pieces, done)) is not done:
            if return_meta_data and var_name is not None:
                yield piece, self.stream_executor.meta_info.get(var_name)
            else:
                yield piece


def _refuse_position_ids_offset(offset: list[int] | None) -> None:
    if offset is not None:
        raise ValueError("position_ids_offset is not supported: vlserve's branches continue their prefix's positions")


def _next_piece(exe: StreamExecutor, var_name: str | None, prev: int) -> tuple[str, bool]:
    """Waits until the text (variable) is longer than prev or can grow no more; returns the new piece
    and whether it is the last."""
    def current() -> str:
        return exe.text_ if var_name is None else str(exe.variables.get(var_name, ""))

    def var_done() -> bool:
        return var_name is not None and var_name in exe.variable_event and exe.variable_event[var_name].is_set()

    exe.wait_changed(lambda: len(current()) > prev or var_done())
    done = exe.is_finished or exe.error_ is not None or var_done()
    # Read after `done`: once done, the text can no longer change, so this read is the last piece.
    return current()[prev:], done


class ProgramStateGroup:
    def __init__(self, states: list[ProgramState], src_state: ProgramState):
        self.states = states
        self.src_state = src_state

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each new variable of the branches becomes a list in the source state.
        concate_and_append: the branches' text (and media) after the fork is appended to the source."""
        if mode == "gather_variable":
            self._gather()
        elif mode == "concate_and_append":
            self.src_state += SglConcateAndAppend(self.states)
            self.src_state.sync()
        else:
            raise ValueError(f"unknown join mode {mode!r}; use 'gather_variable' or 'concate_and_append'")
        for s in self.states:
            s.stream_executor.end()

    def _gather(self) -> None:
        src = self.src_state.stream_executor
        before = set(src.variables)
        for child in self.states:
            exe = child.stream_executor
            exe.sync()
            if exe.error_ is not None:
                src.set_error(exe.error_)
                continue
            for name in set(exe.variables) - before:
                src.variables.setdefault(name, []).append(exe.variables[name])
                src.meta_info.setdefault(name, []).append(exe.meta_info.get(name))

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """`forks[i] += expr` appends to branch i in place (ProgramState.__iadd__ returns the branch),
        then assigns it back here: only that same branch may be assigned."""
        if value is not self.states[i]:
            raise ValueError("a fork group's branches cannot be replaced; append to them with forks[i] += ...")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self):
        return iter(self.states)

    def __iadd__(self, other):
        if isinstance(other, Callable) and not isinstance(other, SglExpr):
            for i, s in enumerate(self.states):
                s += other(i)
        elif isinstance(other, (list, tuple)):
            for s, expr in zip(self.states, other, strict=True):
                s += expr
        else:
            for s in self.states:
                s += other
        return self
