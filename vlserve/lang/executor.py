"""One executor per program state: a queue of statements and a worker thread that runs them in order.

`s += expr` only enqueues; `s[name]` waits for that variable; `s.text()` waits for the queue.
An exception in a statement (or in the program, see program.py) is kept and raised again by every
later read. The executor ends explicitly (end()), never from __del__.
"""

import queue
import threading
import uuid

from vlserve.lang.chat_spec import ChatSpecTurn
from vlserve.lang.global_config import global_config
from vlserve.lang.ir import (SglCommitLazy, SglConcateAndAppend, SglConstantText, SglExpr, SglExprList, SglGen,
                             SglImage, SglRoleBegin, SglRoleEnd, SglSamplingParams, SglSelect, SglVarScopeBegin,
                             SglVarScopeEnd, SglVideo, variable_names)
from vlserve.lang.media import image_item, video_item
from vlserve.lang.messages import role_message
from vlserve.lang.spec import Speculation


class StreamExecutor:
    def __init__(self, backend, arguments: dict, default_sampling_para: SglSamplingParams, chat_template=None,
                 stream: bool = False, num_api_spec_tokens: int | None = None, use_thread: bool = True):
        self.sid = uuid.uuid4().hex
        self.backend = backend
        self.arguments = arguments
        self.default_sampling_para = default_sampling_para
        self.chat_template = chat_template or backend.get_chat_template()
        self.stream = stream
        self.num_api_spec_tokens = num_api_spec_tokens

        self.variables: dict = {}
        self.variable_event: dict[str, threading.Event] = {}
        self.meta_info: dict = {}
        self.text_ = ""
        self.messages_: list[dict] = []
        self.cur_role: str | None = None
        self.cur_role_begin_pos: int | None = None
        self.media: list = []  # every image and video so far, in text order (MediaItem)
        self.cur_images: list = []  # media of the current role (for messages())
        self.fork_start_text_pos: int | None = None
        self.fork_start_media_pos: int = 0
        self._scope_starts: dict[str, int] = {}
        # (chars, tokens): the runtime's token count of text_[:chars], from its last answer (select uses it)
        self.token_mark: tuple[int, int] | None = None
        self.speculation = Speculation()  # completion-model API speculative execution
        self.chat_spec = ChatSpecTurn()  # chat-model API speculative execution (one assistant turn)

        self.error_: BaseException | None = None
        self.is_finished = False
        self.children: list["StreamExecutor"] = []
        self._changed = threading.Condition()
        self._ended = False
        self.use_thread = use_thread
        if use_thread:
            self.queue: queue.Queue = queue.Queue()
            self.worker = threading.Thread(target=self._worker, name=f"sgl-{self.sid[:8]}", daemon=True)
            self.worker.start()

    # ---- the program's side ----------------------------------------------------------------------
    def submit(self, expr) -> None:
        if self._ended:
            raise RuntimeError("this program state has ended; no statement can be added")
        if isinstance(expr, str):
            expr = SglConstantText(expr)
        elif not isinstance(expr, SglExpr):
            raise TypeError(f"cannot add {type(expr).__name__} to a program state; use a string or an expression")
        for name in variable_names(expr):
            self.variable_event[name] = threading.Event()
        if self.use_thread:
            self.queue.put(expr)
        else:
            self._execute(expr)

    def sync(self) -> None:
        if self.use_thread:
            self.queue.join()

    def get_var(self, name: str):
        if name in self.variable_event:
            self.variable_event[name].wait()
        self._raise_error()
        return self.variables[name]

    def set_var(self, name: str, value) -> None:
        self.variables[name] = value

    def get_meta_info(self, name: str):
        if name in self.variable_event:
            self.variable_event[name].wait()
        self._raise_error()
        return self.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        self._raise_error()
        return self.text_

    def messages(self) -> list[dict]:
        self.sync()
        self._raise_error()
        return self.messages_

    def error(self) -> BaseException | None:
        self.sync()
        return self.error_

    def fork(self, size: int = 1) -> list["StreamExecutor"]:
        size = int(size)
        self.sync()
        self._raise_error()
        if size > 1 and self.text_ and global_config.enable_fork_hint:
            # The fork hint: the shared prefix (text and media) is prefilled and cached before any branch
            # request exists, so every branch hits it. Forking an empty state sends nothing.
            self.submit(SglCommitLazy())
            self.sync()
            self._raise_error()
        children = [self._child() for _ in range(size)]
        self.children.extend(children)
        return children

    def _child(self) -> "StreamExecutor":
        child = StreamExecutor(self.backend, self.arguments, self.default_sampling_para, self.chat_template,
                               self.stream, self.num_api_spec_tokens, self.use_thread)
        child.variables = dict(self.variables)
        child.meta_info = dict(self.meta_info)
        child.text_ = self.text_
        child.messages_ = list(self.messages_)
        child.cur_role, child.cur_role_begin_pos = self.cur_role, self.cur_role_begin_pos
        child.media, child.cur_images = list(self.media), list(self.cur_images)
        child.fork_start_text_pos, child.fork_start_media_pos = len(self.text_), len(self.media)
        child.token_mark = self.token_mark
        return child

    def set_error(self, error: BaseException) -> None:
        if self.error_ is None:
            self.error_ = error
        for event in list(self.variable_event.values()):
            event.set()
        self._notify()

    def end(self) -> None:
        """No more statements: the worker finishes the queue and exits. Forked children end too."""
        for child in self.children:
            child.end()
        if self._ended:
            return
        self._ended = True
        if self.use_thread:
            self.queue.put(None)
        else:
            self._finish()
        self.backend.end_program(self)

    def _raise_error(self) -> None:
        if self.error_ is not None:
            raise self.error_

    # ---- the worker ------------------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            expr = self.queue.get()
            if expr is None:
                self._finish()
                self.queue.task_done()
                return
            if self.error_ is None:  # after an error, later statements are drained, not run
                try:
                    self._execute(expr)
                except BaseException as e:  # noqa: BLE001 - kept for s[name] / s.text() to raise
                    self.set_error(e)
            else:  # its variables were added after the error: wake their readers, who raise it
                self.set_error(self.error_)
            self.queue.task_done()
            self._notify()

    def _finish(self) -> None:
        with self._changed:
            self.is_finished = True
            self._changed.notify_all()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait_changed(self, ready) -> None:
        """Blocks until ready() holds (checked whenever the state changes)."""
        with self._changed:
            self._changed.wait_for(lambda: ready() or self.is_finished or self.error_ is not None)

    # ---- statements ------------------------------------------------------------------------------
    def _execute(self, expr) -> None:
        if isinstance(expr, str):  # roles and lists may hold plain strings
            expr = SglConstantText(expr)
        handler = _HANDLERS.get(type(expr))
        if handler is None:
            raise TypeError(f"not a statement of the language: {expr!r}")
        handler(self, expr)

    def _execute_list(self, expr: SglExprList) -> None:
        for e in expr.expr_list:
            self._execute(e)

    def _execute_constant(self, expr: SglConstantText) -> None:
        self._execute_fill(expr.value)

    def _execute_fill(self, value: str, prefix: bool = False) -> None:
        value = str(value)
        if not prefix and self._chat_speculating():
            self.chat_spec.add_text(value)
            return
        self.speculation.consume_text(value)
        self._append(value)

    def _append(self, value: str) -> None:
        self.text_ += value
        self._notify()

    def _chat_speculating(self) -> bool:
        return (self.cur_role == "assistant" and self.num_api_spec_tokens is not None
                and getattr(self.backend, "is_chat_model", False))

    def _resolve_sampling_params(self, params: SglSamplingParams) -> SglSamplingParams:
        merged = params.merged_over(self.default_sampling_para)
        if self.chat_template.stop_str:
            merged.stop = merged.stop_list() + list(self.chat_template.stop_str)
        return merged

    def _execute_gen(self, expr: SglGen) -> None:
        params = self._resolve_sampling_params(expr.sampling_params)
        if self._chat_speculating():
            self.chat_spec.add_gen(expr.name, params)  # filled from one call at the role's end
            return
        if self.stream:
            self._stream_gen(expr.name, params)
            return
        comp, meta = self.backend.generate(self, params)
        self._append(comp)
        self._set_variable(expr.name, comp, meta)

    def _stream_gen(self, name: str | None, params: SglSamplingParams) -> None:
        if name is not None:
            self.variables[name] = ""
        meta = {}
        for delta, meta in self.backend.generate_stream(self, params):
            if name is not None:
                self.variables[name] += delta
            self._append(delta)
        self._set_variable(name, self.variables.get(name, ""), meta)

    def _set_variable(self, name: str | None, value, meta) -> None:
        if name is None:
            return
        self.variables[name] = value
        self.meta_info[name] = meta
        self.variable_event.setdefault(name, threading.Event()).set()
        self._notify()

    def _execute_select(self, expr: SglSelect) -> None:
        decision = self.backend.select(self, expr.choices, expr.temperature, expr.choices_method)
        self._execute_fill(decision.decision)
        self._set_variable(expr.name, decision.decision, decision.meta_info)

    def _execute_image(self, expr: SglImage) -> None:
        self._add_media(image_item(expr.source), self.chat_template.image_token)

    def _execute_video(self, expr: SglVideo) -> None:
        self._add_media(video_item(expr.source, expr.num_frames), self.chat_template.video_token)

    def _add_media(self, item, token: str) -> None:
        self.media.append(item)
        self.cur_images.append(item)
        self.speculation.clear()
        self._append(token)

    def _execute_role_begin(self, expr: SglRoleBegin) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {expr.role!r} begins inside role {self.cur_role!r}; roles do not nest")
        if not self.messages_ and expr.role != "system" and self.chat_template.default_system_prompt:
            self._execute_role_begin(SglRoleBegin("system"))
            self._execute_fill(self.chat_template.default_system_prompt)
            self._execute_role_end(SglRoleEnd("system"))
        self.cur_role = expr.role
        prefix, _ = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._execute_fill(prefix, prefix=True)
        self.cur_role_begin_pos = len(self.text_)

    def _execute_role_end(self, expr: SglRoleEnd) -> None:
        if self._chat_speculating():
            self.backend.role_end_generate(self)  # fills the turn's gens from one call (or several)
            self._append(self.chat_spec.text())
            for name, value in self.chat_spec.take_variables():
                self._set_variable(name, value, {})
        self.cur_role = None
        body = self.text_[self.cur_role_begin_pos:]
        _, suffix = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._execute_fill(suffix)
        self.messages_.append(role_message(expr.role, body, self.cur_images, self.chat_template))
        self.cur_images = []

    def _execute_var_scope_begin(self, expr: SglVarScopeBegin) -> None:
        self._scope_starts[expr.name] = len(self.text_)

    def _execute_var_scope_end(self, expr: SglVarScopeEnd) -> None:
        self._set_variable(expr.name, self.text_[self._scope_starts.pop(expr.name):], {})

    def _execute_commit(self, expr: SglCommitLazy) -> None:
        self.backend.commit_lazy_operations(self)

    def _execute_concat(self, expr: SglConcateAndAppend) -> None:
        for state in expr.states:
            child = state.stream_executor
            child.sync()
            child._raise_error()
            self.media.extend(child.media[child.fork_start_media_pos:])
            self._execute_fill(child.text_[child.fork_start_text_pos:])


_HANDLERS = {
    SglExprList: StreamExecutor._execute_list,
    SglConstantText: StreamExecutor._execute_constant,
    SglGen: StreamExecutor._execute_gen,
    SglSelect: StreamExecutor._execute_select,
    SglImage: StreamExecutor._execute_image,
    SglVideo: StreamExecutor._execute_video,
    SglRoleBegin: StreamExecutor._execute_role_begin,
    SglRoleEnd: StreamExecutor._execute_role_end,
    SglVarScopeBegin: StreamExecutor._execute_var_scope_begin,
    SglVarScopeEnd: StreamExecutor._execute_var_scope_end,
    SglCommitLazy: StreamExecutor._execute_commit,
    SglConcateAndAppend: StreamExecutor._execute_concat,
}
