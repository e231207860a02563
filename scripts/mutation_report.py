"""Markdown report of a mutmut run in a staging folder (scripts/mutation.sh): score per module and
every surviving mutant with its file:line (in the repository's layout) and the mutated line.

    python scripts/mutation_report.py STAGE OUT.md SECONDS "TESTS" MODULE.py...
"""

import ast
import difflib
import json
import sys
from collections import Counter
from pathlib import Path

# mutmut's exit codes (mutmut/stats.py): a timeout is a kill (the mutant hung the tests)
KILLED = {1: "killed", 3: "killed", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout"}
STATUS = {0: "survived", 5: "no tests", 33: "no tests", None: "not checked", 34: "skipped", 37: "type check"}


# Survivors judged equivalent (no test can tell them apart from the original), with the reason:
# (module, text in the original line and gone from the mutated one, text in the mutated line, why), optionally followed
# by text the line before the mutated one must hold (for a line such as `continue` that occurs more than once).
# Reviewed by hand; a new survivor that matches none of these is a gap to kill with a test.
EQUIVALENT = [
    ("vlserve/sampling/sampler.py", "dim=-1", "dim=+1", "the tensors are [B, V]: dim 1 is dim -1"),
    ("vlserve/sampling/sampler.py", "sort(dim=-1, descending=True)", "sort(descending=True)",
     "sort's default dim is -1"),
    ("vlserve/sampling/sampler.py", "if not bool(greedy.all())", "bool(None)",
     "a shortcut: with no sampled rows the sampling branch does nothing"),
    ("vlserve/sampling/sampler.py", "dtype=logits.dtype", "[:, None]",
     "logits are float32 (documented), the default dtype of torch.tensor of floats"),
    ("vlserve/sampling/sampler.py", "dtype=probs.dtype", "[:, None]",
     "probs are float32 (documented), the default dtype of torch.tensor of floats"),
    ("vlserve/sampling/sampler.py", "p.top_k > 0", "p.top_k >= 0", "SamplingParams.validate rejects top_k = 0"),
    ("preprocess/hashing.py", "dtype=np.int64", "tobytes()",
     "np.asarray of Python ints is int64 on 64-bit Linux and macOS (not on Windows)"),
    ("preprocess/hashing.py", 'cast("B")', 'cast("b")', "the same bytes reach the hash"),
    ("preprocess/hashing.py", 'i.to_bytes(8, "little")', "to_bytes(",
     "another injective encoding of the position: ids stay distinct and deterministic; they are never "
     "persisted or compared across builds"),
    ("vlserve/cache/radix_cache.py", "node.alive = False", "node.alive = None",
     "None is falsy like False; every reader tests alive by truth value"),
    ("vlserve/cache/radix_cache.py", "node.parent = None", 'node.parent = ""',
     "a dead node's parent is never read (every entry point checks alive first); both drop the reference"),
    ("vlserve/cache/radix_cache.py", "upper.last_access = node.last_access", "upper.last_access = None",
     "_split's only caller (_descend) sets the returned node's last_access on the next line"),
    ("vlserve/cache/radix_cache.py", "node.size > 0 and", "node.size >= 0 and",
     "an empty edge already fails the line before (its child key is missing)"),
    ("vlserve/cache/radix_cache.py", "self._clock = 0", "self._clock = 1",
     "recency stamps are only compared with each other (LRU order; a heap entry is stale when its stamp differs): "
     "shifting them all changes no order; pretty() prints them for debugging"),
    ("vlserve/cache/radix_cache.py", "self._clock += 1", "self._clock += 2",
     "recency stamps are only compared with each other: any increasing clock gives the same order"),
    ("vlserve/cache/radix_cache.py", "matched = 0", "matched = 1",
     "the child was found by its first token (its first page with pages), so position 0 always matches: "
     "the loop's first step is the same"),
    # the root: never evictable (lock_ref 1), never in the LRU heap, skipped by every walk and by pretty/check_integrity
    ("vlserve/cache/radix_cache.py", "TreeNode(key=[]", "TreeNode(key=None",
     "the root's key is never read: walks start at its children; iter_nodes, pretty and check_integrity skip it"),
    ("vlserve/cache/radix_cache.py", "value=self._empty, parent=None", "value=None, parent=None",
     "the root's slots are never read: a match collects the values of the nodes below it, a miss returns _empty"),
    ("vlserve/cache/radix_cache.py", "parent=None, uid=next(self._uids)", "parent=None, uid=None",
     "the root never enters the LRU heap, where alone uids are compared; the other nodes' uids keep their order"),
    ("vlserve/cache/radix_cache.py", "last_access=0)", "last_access=1)",
     "the root never enters the LRU heap and pretty() skips it: its last_access is never read"),
    ("vlserve/cache/radix_cache.py", "last_access=0)", "last_access=None)",
     "the root never enters the LRU heap and pretty() skips it: its last_access is never read"),
    ("vlserve/cache/radix_cache.py", "self.root.lock_ref = 1", "self.root.lock_ref = 2",
     "the root is only tested for lock_ref == 0 (false either way); locks and unlocks stop below it, and "
     "check_integrity never compares a child of the root with it"),
    ("vlserve/cache/radix_cache.py", "self.root.lock_ref = 1", "self.root.lock_ref = None",
     "the root is only tested for lock_ref == 0 (false either way); locks and unlocks stop below it, and "
     "check_integrity never compares a child of the root with it"),
    # the LRU heap's compaction: a rebuild from the live evictable leaves, the same entries a lazy pop would keep
    ("vlserve/cache/radix_cache.py", "> 2 * self._num_nodes + 64", ">= 2 * self._num_nodes + 64",
     "the heap is compacted one push sooner: the same entries, the same eviction order, a bound one lower"),
    ("vlserve/cache/radix_cache.py", "2 * self._num_nodes + 64", "2 * self._num_nodes - 64",
     "performance only: the heap is compacted more often (an O(nodes) rebuild of the same entries); eviction "
     "order and the size bound hold; tests check correctness, never timings"),
    ("vlserve/cache/radix_cache.py", "2 * self._num_nodes + 64", "2 / self._num_nodes + 64",
     "performance only: the heap is compacted more often once the tree has more than a few nodes (an O(nodes) "
     "rebuild of the same entries; _num_nodes is at least 1 here, the leaf being pushed); tests never time it"),
    ("vlserve/sampling/penalties.py", "sub > 0", "sub >= 0", "a zero logit stays zero either way (0 / p == 0 * p)"),
    ("vlserve/sampling/penalties.py", 'float("-inf")', 'float("-INF")', "float() reads the name in any case"),
    ("vlserve/sampling/penalties.py", "dtype=like.dtype", "[:, None]",
     "logits are float32 (Llava.forward returns .float()), the default dtype of torch.tensor of floats"),
    ("vlserve/constrained/jump_forward.py", "if cut else data", "if (cut) or True else data",
     "with cut 0 the slice data[: len(data) - 0] is data itself: the shortcut only saves a copy"),
    ("vlserve/constrained/jump_forward.py", 'decode("utf-8")', 'decode("UTF-8")', "codec names ignore case"),
    ("vlserve/scheduler/cache_manager.py", "req.req_row, req.tree_len, req.kv_len", "req.req_row, None, req.kv_len",
     "with the cache disabled tree_len is always 0 (nothing matches, cache_prefix returns at once): "
     "None slices the same"),
    ("vlserve/scheduler/cache_manager.py", "if first_free < req.kv_len:", "if first_free <= req.kv_len:",
     "at equality the range to free is empty, and SlotAllocator.free returns on an empty tensor"),
    ("vlserve/scheduler/cache_manager.py", "if short > 0:", "if short >= 0:",
     "evict(0) evicts nothing: its loop runs while freed < num_tokens"),
    # alloc's `last` (the slot of position kv_len-1) is read by alloc_extend only to fill a partly used last
    # page (head > 0): with page_size 1, on a page boundary or at kv_len 0 it is ignored, whatever it holds
    ("vlserve/scheduler/cache_manager.py", "req.kv_len % self.page_size", "req.kv_len / self.page_size",
     "truthy also on page boundaries (and falsy at 0 as before), where alloc_extend ignores `last`"),
    ("vlserve/scheduler/cache_manager.py", "self.page_size > 1 and", "self.page_size > 1 or",
     "`last` is then read for page_size 1 and on page boundaries too, where alloc_extend ignores it "
     "(row[kv_len - 1] is a valid index even at kv_len 0)"),
    ("vlserve/scheduler/cache_manager.py", "self.page_size > 1 and", "self.page_size >= 1 and",
     "with page_size 1, kv_len % 1 is 0: partial_page stays falsy"),
    ("vlserve/scheduler/cache_manager.py", "if partial_page else", "if (partial_page) or True else",
     "`last` is then read when no page is partly used, where alloc_extend ignores it"),
    ("vlserve/scheduler/cache_manager.py", "else -1", "else +1",
     "the placeholder for no partly used page, which alloc_extend never reads"),
    ("vlserve/scheduler/cache_manager.py", "else -1", "else -2",
     "the placeholder for no partly used page, which alloc_extend never reads"),
    ("vlserve/scheduler/cache_manager.py", "self.rows.read(req.req_row, 0, aligned)",
     "self.rows.read(req.req_row, None, aligned)", "a slice from None starts at 0"),
    ("vlserve/constrained/state.py", "self.eos_accepted = False", "self.eos_accepted = None",
     "None is falsy like False; every reader (advance, fill_allowed_mask, is_terminated's `or`) "
     "tests it by truth value"),
    ("vlserve/constrained/state.py", "if nxt is None or byte_state is None:", "if nxt is None and byte_state is None:",
     "the token and byte automata come from one regex and share state ids; next_state returns only live states, "
     "which the byte DFA reaches by the same bytes, and both refuse special and out-of-table ids: both are None "
     "together (only an outlines-core bug could split them)"),
    # propose_jump's `full` is old + forced bytes, a walk of the byte DFA, which reads only valid UTF-8 (a regex over
    # characters) from a window that starts on a character boundary: at most an incomplete last character is cut
    ("vlserve/constrained/jump_forward.py", "if full is None or len(full)", "if full is None and len(full)",
     "full is never None (see above); a `full` no longer than the old text goes on to _stable_prefix, which keeps "
     "nothing that ends at or before the old text (returns 0): None either way"),
    ("vlserve/constrained/jump_forward.py", "len(full) <= len(old)", "len(full) < len(old)",
     "at equality the tail spells only the old text, and _stable_prefix keeps nothing that ends at or before it "
     "(returns 0): None either way"),
    ("vlserve/scheduler/prefill.py", 'raise OutOfSlots(f"need {need} slots")', "raise OutOfSlots(None)",
     "caught by the `except OutOfSlots` around it, which never reads the message"),
    ("vlserve/scheduler/policy.py", "RadixCache(_DiscardSlots())", "RadixCache(None)",
     "the key-only tries are never evicted or reset, the only calls that free slots: the allocator is never called"),
    ("vlserve/scheduler/policy.py", "dtype=torch.int64", "len(key), ))",
     "RadixCache.insert keeps its own int64 copy of the slots, and a key trie's slots are never read"),
    ("vlserve/scheduler/policy.py", "dtype=torch.int64", "dtype=None",
     "RadixCache.insert keeps its own int64 copy of the slots, and a key trie's slots are never read"),
    ("vlserve/scheduler/policy.py", "seed: int = 0,", "seed: int = 1,",
     "any fixed default seed makes the random policy a reproducible shuffle; which permutation is not promised"),
    ("vlserve/scheduler/policy.py", "if node in ends else len(reqs)", "if (node in ends) and False else",
     "requests are inserted into the private trie in arrival order, so a node's children already sit in the order "
     "of their first requests: with `first` all equal the stable sort keeps that same order"),
    # schedule()'s loop over a snapshot of the running list: retraction takes victims from the end of the list,
    # so once a snapshot entry is no longer running, every entry after it was retracted too
    ("vlserve/scheduler/scheduler.py", "continue", "break",
     "the requests after a retracted one in the snapshot were all retracted before it (victims come from the end "
     "of the running list): nothing is left to skip", "if req not in self.running:"),
    # admit() with a budget of 0 admits nothing (its loop breaks first), and with an empty queue it has nothing to
    # admit; it still orders the queue, which writes only matched_len (a hint, rewritten before every use)
    ("vlserve/scheduler/scheduler.py", "if self.waiting and budget > 0:", "if self.waiting and budget >= 0:",
     "admit() with a budget of 0 admits nothing; the queue's ordering writes only matched_len, rewritten before "
     "every use (under the random policy one more shuffle is drawn: no order is promised there)"),
    ("vlserve/scheduler/scheduler.py", "if self.waiting and budget > 0:", "if self.waiting or budget > 0:",
     "admit() with an empty queue returns nothing, and with a budget of 0 admits nothing (see `budget >= 0`)"),
    ("vlserve/scheduler/scheduler.py", "error_status: int = 500)", "error_status: int = 501)",
     "_emit's default serves only outputs without an error (every _finish passes its status), and error_status is "
     "read only with an error (engine/output.py)", "finished: bool"),
]


def equivalence(module: str, original: str, mutated: str, before: str = "") -> str | None:
    for mod, a, b, why, *context in EQUIVALENT:
        if mod == module and a in original and b in mutated and a not in mutated and all(c in before for c in context):
            return why
    return None


def status(code) -> str:
    return KILLED.get(code) or STATUS.get(code, "suspicious")


def staged(module: str) -> str:
    return f"vlserve/{module}" if module.startswith(("kernels/", "preprocess/")) else module


def def_lines(source: str) -> dict[str, int]:
    """'f' or 'Class.f' -> the line of its `def` in the repository's file."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = item.lineno
    return out


def function_of(key: str) -> tuple[str, str]:
    """'pkg.mod.xǁClsǁmeth__mutmut_3' -> ('Cls.meth', 'xǁClsǁmeth'); 'pkg.mod.x_f__mutmut_1' -> ('f', 'x_f')."""
    mangled = key.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]
    if mangled.startswith("xǁ"):
        _, cls, meth = mangled.split("ǁ")
        return f"{cls}.{meth}", mangled
    return mangled[2:], mangled


def body(lines: list[str], span: list[int]) -> list[str]:
    text = lines[span[0] - 1: span[1]]
    start = next(i for i, line in enumerate(text) if line.lstrip().startswith(("def ", "async def ")))
    return text[start:]


def survivors(stage: Path, module: str, codes: dict) -> list[tuple[int, str, str, str, str]]:
    """(line, function, original line, mutated line, the line before) of every mutant that no test killed."""
    mutated = (stage / "mutants" / staged(module)).read_text().splitlines()
    spans = json.loads((stage / "mutants" / (staged(module) + ".spans")).read_text())["spans"]
    defs = def_lines(Path(module).read_text())
    out = []
    for key, code in codes.items():
        if status(code) not in ("survived", "no tests", "suspicious"):
            continue
        func, mangled = function_of(key)
        name = key.rsplit(".", 1)[1]
        # the name in the `def` line differs in every mutant; a mutated default value is in that line
        orig = [t.replace(f"{mangled}__mutmut_orig(", "f(") for t in body(mutated, spans[f"{mangled}__mutmut_orig"])]
        mut = [t.replace(f"{name}(", "f(") for t in body(mutated, spans[name])]
        diff = [op for op in difflib.SequenceMatcher(a=orig, b=mut).get_opcodes() if op[0] != "equal"]
        if not diff:
            continue
        _, i1, i2, j1, j2 = diff[0]
        line = defs.get(func, 0) + i1
        out.append((line, f"{func} ({status(code)})", " / ".join(s.strip() for s in orig[i1:i2]),
                    " / ".join(s.strip() for s in mut[j1:j2]), orig[i1 - 1].strip() if i1 else ""))
    return sorted(out)


TABLE_HEAD = ["| module | mutants | checked | killed | timeout | survived | of them equivalent | no tests "
              "| not checked | score | score without equivalents |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]


def summary(stage: Path, module: str, codes: dict) -> tuple[str, list[str]]:
    """The module's table row and its list of survivors."""
    n = Counter(status(c) for c in codes.values())
    checked = sum(n.values()) - n["not checked"]
    rows = survivors(stage, module, codes) if codes else []
    why = [equivalence(module, a, b, before) for _, _, a, b, before in rows]
    equivalent = sum(w is not None for w in why)
    killed = n["killed"] + n["timeout"]
    score = f"{killed / checked:.1%}" if checked else "n/a"
    adjusted = f"{killed / (checked - equivalent):.1%}" if checked > equivalent else "n/a"
    row = (f"| {module} | {len(codes)} | {checked} | {n['killed']} | {n['timeout']} | "
           f"{n['survived'] + n['suspicious']} | {equivalent} | {n['no tests']} | {n['not checked']} "
           f"| {score} | {adjusted} |")
    details = ["", f"## {module}: {len(rows)} surviving, {equivalent} of them equivalent", ""]
    details += [f"- `{module}:{line}` {func}: `{a}` → `{b}`" + (f" — equivalent: {w}" if w else " — **not killed**")
                for (line, func, a, b, _), w in zip(rows, why)] or ["(none)"]
    return row, details


def main() -> None:
    stage, out, seconds, tests, modules = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
    md = ["# Mutation testing", "",
          f"`scripts/mutation.sh {' '.join(modules)}` (mutmut; {int(seconds) // 60} min {int(seconds) % 60} s), "
          f"tests: `{tests}`.", "",
          "Score = (killed + timeout) / checked; \"no tests\" (no selected test calls the function) counts "
          "as surviving. Each survivor is listed with the repository file:line and the mutated line.", ""]
    before_path = stage / "before.json"
    if before_path.exists():  # scripts/mutation_recheck.py ran the survivors against newer tests
        before = json.loads(before_path.read_text())
        md += ["Before the tests written for its survivors (the run above):", "", *TABLE_HEAD,
               *(summary(stage, m, before.get(m, {}))[0] for m in modules), "",
               "After them (`MUTATION_RECHECK` ran each survivor against the new tests):", ""]
    md += TABLE_HEAD
    details = []
    for module in modules:
        meta = stage / "mutants" / (staged(module) + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        row, listed = summary(stage, module, codes)
        md.append(row)
        details += listed
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(md + details) + "\n")


if __name__ == "__main__":
    main()
