"""Execute the LLVM IR Triton lowers a small kernel to for an NVIDIA GPU, one CTA, on the CPU.

Enough of LLVM's NVPTX IR for the straight-line kernels Triton makes of load -> scan -> store
(tests/test_gpu_scan.py): integer and float32 arithmetic, comparisons, select, casts, getelementptr,
vectors (insert/extract/shufflevector and lane-wise ops), the thread and block ids, warp shuffles
(shfl.sync up/down/bfly/idx, with PTX's clamp and segment mask), barriers, shared memory, and
Triton's inline PTX for predicated ld.global / st.global / st.shared of 32-bit words. All threads
run each instruction together (the code has no branches), so every value is a numpy array over
the CTA's threads; a vector value is a list of them. Anything else raises NotImplementedError.
"""

from __future__ import annotations

import re

import numpy as np

WARP = 32
INT_BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64}
BYTES = {"i8": 1, "i16": 2, "i32": 4, "i64": 8, "float": 4, "half": 2, "bfloat": 2, "double": 8}
FLAGS = {"nuw", "nsw", "disjoint", "exact", "samesign", "nneg", "inbounds", "nusw", "tail"}
VECTOR = re.compile(r"<(\d+) x (\w+)> (.*)$", re.S)


def split_top(s: str) -> list[str]:
    """Split at the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for c in s:
        if c in "({<[":
            depth += 1
        elif c in ")}>]":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    return out + ([cur.strip()] if cur.strip() else [])


class CTA:
    """One CTA of `num_threads` threads running the kernel in `llir`; `params` gives the kernel's
    parameters by position (pointers as byte addresses into `memory`, a uint8 array that loads and
    stores go to; shared memory is separate)."""

    def __init__(self, llir: str, num_threads: int, params: list, memory: np.ndarray):
        self.tid = np.arange(num_threads, dtype=np.int64)
        self.memory = {1: memory, 3: np.zeros(1 << 18, np.uint8)}
        body = llir[llir.index("define ptx_kernel") :]
        header, rest = body.split("{", 1)
        self.lines = [line.strip() for line in rest.split("\n}", 1)[0].splitlines()]
        self.v: dict[str, object] = {}
        declared = re.findall(r"(ptr addrspace\(\d\)|i32|i64|float)[^,%]*(%\d+)", header)
        for (ty, name), value in zip(declared, params + [0] * len(declared)):
            self.v[name] = np.full(num_threads, value, np.float32 if ty == "float" else np.int64)

    def run(self) -> None:
        for line in self.lines:
            line = re.sub(r"(, )?!\w+ !\d+", "", line).strip()
            if not line or line.startswith(";") or line.startswith("ret"):
                continue
            if line.startswith("%") and "=" in line.split("(")[0]:
                name, rhs = line.split("=", 1)
                self.v[name.strip()] = self.instruction(rhs.strip())
            else:
                self.instruction(line)

    # operands -------------------------------------------------------------------------
    def constant(self, ty: str, tok: str):
        n = len(self.tid)
        if tok in ("poison", "undef", "zeroinitializer", "null"):
            return np.zeros(n, np.float32 if ty == "float" else np.int64)
        if tok in ("true", "false"):
            return np.full(n, tok == "true")
        if tok == "@global_smem":
            return np.zeros(n, np.int64)
        if ty == "float":
            if tok.startswith("0x"):  # LLVM writes float constants as the hex of their double
                return np.full(n, np.frombuffer(bytes.fromhex(tok[2:])[::-1], np.float64)[0], np.float32)
            return np.full(n, float(tok), np.float32)
        return np.full(n, int(tok), np.int64)

    def value(self, ty: str, tok: str):
        tok = tok.strip()
        gep = re.match(r"getelementptr (?:inbounds )?(?:nuw )?\((.*)\)$", tok, re.S)
        if gep:  # a constant-expression address
            return self.instruction("getelementptr " + gep.group(1))
        if tok.startswith("%"):
            return self.v[tok]
        return self.constant(ty, tok)

    def typed(self, s: str):
        """'i32 %5', '<4 x float> %7', 'ptr addrspace(1) %0' -> (element type, value)."""
        s = re.sub(r"\b(noundef|nonnull|nneg)\b\s*", "", s).strip()
        if s.startswith("ptr"):
            return "ptr", self.value("i64", re.sub(r"^ptr( addrspace\(\d\))? ", "", s))
        vm = VECTOR.match(s)
        if vm:
            n, ty, tok = int(vm.group(1)), vm.group(2), vm.group(3).strip()
            if tok.startswith("%"):
                return ty, self.v[tok]
            if tok.startswith("<"):
                return ty, [self.value(ty, t.split(" ", 1)[1]) for t in split_top(tok[1:-1])]
            return ty, [self.constant(ty, tok)] * n
        ty, tok = s.split(" ", 1)
        return ty, self.value(ty, tok)

    def operands(self, rest: str):
        """'<ty> a, b' -> (element type, [a, b]), both of the type written once."""
        vm = VECTOR.match(rest)
        if vm:
            head = f"<{vm.group(1)} x {vm.group(2)}>"
            return vm.group(2), [self.typed(f"{head} {t}")[1] for t in split_top(vm.group(3))]
        ty, tail = rest.split(" ", 1)
        return ty, [self.value(ty, t) for t in split_top(tail)]

    # arithmetic -----------------------------------------------------------------------
    @staticmethod
    def wrap(x, ty: str):
        """int64 -> the signed value of the low bits of integer type ty."""
        bits = INT_BITS[ty]
        if bits == 1:
            return x.astype(bool)
        if bits == 64:
            return x.astype(np.int64)
        x = x.astype(np.int64) & ((1 << bits) - 1)
        return np.where(x >= (1 << (bits - 1)), x - (1 << bits), x)

    @staticmethod
    def unsigned(x, ty: str):
        bits = INT_BITS[ty]
        x = np.asarray(x).astype(np.int64)
        return x.astype(np.uint64) if bits == 64 else (x & ((1 << bits) - 1)).astype(np.uint64)

    def integer(self, op: str, ty: str, a, b):
        if ty == "i1":
            return {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[op](a, b)
        ua, ub = self.unsigned(a, ty), self.unsigned(b, ty)
        ops = {
            "and": lambda: ua & ub,
            "or": lambda: ua | ub,
            "xor": lambda: ua ^ ub,
            "shl": lambda: ua << ub,
            "lshr": lambda: ua >> ub,
            "ashr": lambda: a.astype(np.int64) >> b.astype(np.int64),
            "add": lambda: ua + ub,
            "sub": lambda: ua - ub,
            "mul": lambda: ua * ub,
            "udiv": lambda: ua // ub,
            "urem": lambda: ua % ub,
            "sdiv": lambda: np.trunc(a / b).astype(np.int64),
            "srem": lambda: np.fmod(a, b).astype(np.int64),
        }
        return self.wrap(ops[op]().astype(np.int64), ty)

    def compare(self, cond: str, ty: str, a, b):
        if cond[0] == "u":
            a, b = self.unsigned(a, ty), self.unsigned(b, ty)
        return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[cond.lstrip("us")]

    def cast(self, op: str, src_ty: str, x, dst_ty: str):
        if op == "bitcast":
            if src_ty == "i32" and dst_ty == "float":
                return self.unsigned(x, "i32").astype(np.uint32).view(np.float32)
            if src_ty == "float" and dst_ty == "i32":
                return self.wrap(x.astype(np.float32).view(np.uint32).astype(np.int64), "i32")
            return x
        if op == "zext":
            return self.unsigned(x, src_ty).astype(np.int64)
        return self.wrap(x, dst_ty)  # sext, trunc

    @staticmethod
    def lanewise(f, *args):
        """f over plain values, or over the elements of vector values."""
        if any(isinstance(a, list) for a in args):
            n = max(len(a) for a in args if isinstance(a, list))
            return [f(*(a[i] if isinstance(a, list) else a for a in args)) for i in range(n)]
        return f(*args)

    # instructions ---------------------------------------------------------------------
    def instruction(self, rhs: str):
        if rhs.startswith(("tail call", "call")):
            return self.call(rhs)
        op, _, rest = rhs.partition(" ")
        words = [w for w in rest.split() if w not in FLAGS]
        rest = " ".join(words)
        if op in ("and", "or", "xor", "shl", "lshr", "ashr", "add", "sub", "mul", "udiv", "urem", "sdiv", "srem"):
            ty, (a, b) = self.operands(rest)
            return self.lanewise(lambda x, y: self.integer(op, ty, x, y), a, b)
        if op in ("fadd", "fmul", "fsub"):
            _, (a, b) = self.operands(rest)
            f = {"fadd": np.add, "fmul": np.multiply, "fsub": np.subtract}[op]
            return self.lanewise(lambda x, y: f(x.astype(np.float32), y.astype(np.float32)), a, b)
        if op == "icmp":
            cond, rest = rest.split(" ", 1)
            ty, (a, b) = self.operands(rest)
            return self.lanewise(lambda x, y: self.compare(cond, ty, x, y), a, b)
        if op == "select":
            (_, c), (_, x), (_, y) = (self.typed(p) for p in split_top(rest))
            return self.lanewise(lambda ci, xi, yi: np.where(ci.astype(bool), xi, yi), c, x, y)
        if op in ("bitcast", "zext", "sext", "trunc"):
            src, dst = rest.split(" to ")
            src_ty, x = self.typed(src)
            dst_ty = VECTOR.match(dst.strip() + " _").group(2) if dst.strip().startswith("<") else dst.strip()
            out = self.lanewise(lambda e: self.cast(op, src_ty, e, dst_ty), x)
            return [out] if dst.strip().startswith("<") and not isinstance(out, list) else out
        if op == "getelementptr":
            parts = split_top(rest)
            _, base = self.typed(parts[1])
            _, index = self.typed(parts[2])
            array = re.match(r"\[(\d+) x (\w+)\]", parts[0])
            size = int(array.group(1)) * BYTES[array.group(2)] if array else BYTES[parts[0]]
            return base + index.astype(np.int64) * size
        if op == "extractvalue":
            m = re.match(r"\{[^}]*\} (%\S+), (\d+)", rest)
            return self.v[m.group(1)][int(m.group(2))]
        if op == "insertelement":
            (_, vec), (_, x), (_, i) = (self.typed(p) for p in split_top(rest))
            vec = list(vec)
            vec[int(i[0])] = x
            return vec
        if op == "extractelement":
            (_, vec), (_, i) = (self.typed(p) for p in split_top(rest))
            return vec[int(i[0])]
        if op == "shufflevector":
            a, b, mask = split_top(rest)
            both = list(self.typed(a)[1]) + list(self.typed(b)[1])
            n = int(re.match(r"<(\d+) x", mask).group(1))
            picks = (
                [0] * n
                if mask.endswith("zeroinitializer")
                else [t.split()[-1] for t in split_top(mask.split(">", 1)[1].strip()[1:-1])]
            )
            return [both[0] * 0 if p in ("poison", "undef") else both[int(p)] for p in picks]
        if op == "load":
            ty, pointer = split_top(rest)[:2]
            space = int(re.search(r"addrspace\((\d)\)", pointer).group(1))
            bits = self.load(space, self.typed(pointer)[1], np.ones(len(self.tid), bool))
            return bits.view(np.float32) if ty == "float" else self.wrap(bits.astype(np.int64), "i32")
        raise NotImplementedError(rhs[:160])

    def call(self, rhs: str):
        if " asm " in rhs:
            return self.inline_ptx(rhs)
        m = re.search(r"@([\w.]+)\((.*)\)", rhs)
        fn, argstr = m.group(1), m.group(2)
        args = [self.typed(a)[1] for a in split_top(argstr)] if argstr.strip() else []
        if fn == "llvm.nvvm.read.ptx.sreg.tid.x":
            return self.tid.copy()
        if fn.startswith("llvm.nvvm.read.ptx.sreg.ctaid."):  # the first program instance
            return np.zeros(len(self.tid), np.int64)
        if fn.startswith("llvm.nvvm.barrier"):
            return None  # lockstep execution: every earlier store is visible already
        if fn.startswith("llvm.nvvm.shfl.sync."):
            return self.shuffle(fn.split(".")[4], *args[1:])
        raise NotImplementedError(fn)

    def shuffle(self, mode: str, value, b, c):
        """PTX shfl.sync: lane j's value, j from the mode; a lane outside [minLane, maxLane] reads
        its own (c packs the clamp value, bits 0-4, and the segment mask, bits 8-12)."""
        lane = self.tid % WARP
        segmask, clamp = (c >> 8) & 31, c & 31
        max_lane = (lane & segmask) | (clamp & ~segmask)
        if mode == "up":
            j, ok = lane - b, lane - b >= max_lane
        elif mode == "down":
            j, ok = lane + b, lane + b <= max_lane
        elif mode == "bfly":
            j, ok = lane ^ b, (lane ^ b) <= max_lane
        else:  # idx
            j = (lane & segmask) | (b & 31 & ~segmask)
            ok = j <= max_lane
        return value[self.tid - lane + np.where(ok, j, lane)]

    def load(self, space: int, address, predicate):
        memory, out = self.memory[space], np.zeros(len(self.tid), np.uint32)
        for t in np.nonzero(predicate)[0]:
            out[t] = memory[int(address[t]) : int(address[t]) + 4].view(np.uint32)[0]
        return out

    def store(self, space: int, address, value, predicate):
        memory = self.memory[space]
        bits = value.view(np.uint32) if value.dtype == np.float32 else self.unsigned(value, "i32").astype(np.uint32)
        for t in np.nonzero(predicate)[0]:
            memory[int(address[t]) : int(address[t]) + 4] = bits[t : t + 1].view(np.uint8)

    def inline_ptx(self, rhs: str):
        """Triton's predicated mov / ld.global / st.global / st.shared of b32 words."""
        m = re.search(r'asm sideeffect "(.*?)", "([^"]*)"\((.*)\)', rhs)
        text = m.group(1).replace("\\0A", "\n").replace("\\09", " ")
        n_out = m.group(2).count("=")
        inputs = {}
        for i, a in enumerate(split_top(m.group(3))):
            x = self.typed(a)[1]
            inputs[n_out + i] = x[0] if isinstance(x, list) else x
        outs = {}
        for ins in (s.strip() for s in text.split(";")):
            if not ins:
                continue
            predicate = np.ones(len(self.tid), bool)
            p = re.match(r"@\$(\d+) (.*)", ins, re.S)
            if p:
                predicate, ins = inputs[int(p.group(1))].astype(bool), p.group(2)
            if mov := re.match(r"mov\.u32 \$(\d+), \$(\d+)", ins):
                outs[int(mov.group(1))] = inputs[int(mov.group(2))].astype(np.int64)
            elif ld := re.match(r"ld\.global(?:\.v\d)?\.b32 \{ ([^}]*) \}, \[ \$(\d+) \+ (-?\d+) \]", ins):
                base = inputs[int(ld.group(2))] + int(ld.group(3))
                for i, r in enumerate(int(r.strip()[1:]) for r in ld.group(1).split(",")):
                    outs[r] = np.where(predicate, self.load(1, base + 4 * i, predicate), outs.get(r, 0))
            elif st := re.match(r"st\.global(?:\.v\d)?\.b32 \[ \$(\d+) \+ (-?\d+) \], \{ ([^}]*) \}", ins):
                base = inputs[int(st.group(1))] + int(st.group(2))
                for i, r in enumerate(int(r.strip()[1:]) for r in st.group(3).split(",")):
                    self.store(1, base + 4 * i, inputs[r], predicate)
            elif sh := re.match(r"st\.shared(?:::cta)?\.b32 \[ \$(\d+) \+ (-?\d+) \], \$(\d+)", ins):
                self.store(3, inputs[int(sh.group(1))] + int(sh.group(2)), inputs[int(sh.group(3))], predicate)
            else:
                raise NotImplementedError(ins)
        results = [self.wrap(outs[i], "i32") for i in range(n_out)]
        return results[0] if n_out == 1 else (results or None)
