#!/usr/bin/env bash
# Every `kiln` command the README's Commands block and the code blocks of docs/*.md show runs,
# with the configs as shipped, and exits 0. A command that fails for a config or CLI reason (a
# field the docs name that does not exist, a schedule the shipped config cannot start, a flag
# that was renamed) fails this test.
#
# This machine has no GPU, no ImageNet and no CIFAR-10, and two cores, so each command runs in
# its CPU-feasible form; the rewriting below is the whole list, and never touches the configs:
#   train, eval, export, sample + --set train.device=CPU parallel.backend=AUTO (NCCL needs CUDA)
#                   precision.opt_level=O0 (fp16 O1-O3 need a GPU) train.steps=2
#                   schedule.warmup_steps=0 (a 2-step run of a 10000-step warmup is not a valid
#                   schedule) train.batch_per_gpu=2 train.global_batch=2*ranks
#                   train.eval_batches=2 data.workers=1 logging.dir=<scratch>, and the model
#                   made small: model.image_size=32 for ViT-B/16, 64 for ResNet-50 (2x2 at its
#                   last batch norm), model.bert.num_layers=2 seq_len=32 vocab_size=1024 for
#                   BERT, model.gpt.num_layers=2 hidden_size=64 num_heads=2 seq_len=64 for
#                   gpt2* configs (vocabulary kept: documented prompts use GPT-2's ids),
#                   model.llama.num_layers=2 hidden_size=64 num_heads=4 num_kv_heads=2
#                   intermediate_size=128 seq_len=64 max_positions=512 vocab_size=320 for the
#                   llama family (configs and presets named *llama* or *qwen*: the chat
#                   tokenizers' 320 ids); eval, export and sample read the checkpoint of the last
#                   documented train of the config
#   model.init_from=DIR (a downloaded model): a kiln export --hf --random-init of the config's
#                   model made small, written here
#   data.path=DIR/...: when DIR is a documented tokenize's --output, that run's folder here
#   export --hf DIR: a new folder of the scratch directory
#   config        + --set train.device=CPU parallel.backend=AUTO precision.opt_level=O0 (it
#                   validates the experiment against this machine's devices)
#   autobatch     + the train settings' device, backend, precision, workers and model size,
#                   train.max_memory_mb=3072, --max-batch 2
#   plan          + the train settings' device, backend, precision, workers and model size
#   bench         --batch 2 --amp O0 --steps 1 --warmup 0 --device cpu (--half dropped), and
#                 the same model shrinking
#   doctor        --dir <scratch> (replacing a documented --dir), or with --config
#                   --set logging.dir=<scratch> (checkpoint.dir under it); --write-mb 8 --max-mb 1
#   mpirun, launch/kiln-mpirun: at most 2 ranks (-np 8 -> -np 2), --hostfile dropped
#   data.path=/data/cifar-10-batches-bin: a CIFAR-10 directory of the real format written here
#   /data/fineweb10B: llm.c shards (one train, one val, GPT-2's ids) written here
#   --onnx, --dump-logits, --dump-inputs FILE: written to the scratch directory
#   [--json]      optional parts run both without and with
#   --resume      "continue from a checkpoint": when no documented train of the config ran
#                 before, the same command without --resume runs first
#   sample        in docs/*.md, when no documented train of the config ran before, a train of
#                 its --config and --set runs first (sampling needs trained weights); the
#                 README's Commands block gets no such help: it must train before it samples,
#                 as a fresh clone would
# Every command calls build/bin/kiln, where the quick start builds it: a bare `kiln` is not on
# PATH after it (cmake --install puts it there), and fails this test.
#   --vocab, --merges FILE: a byte-level BPE vocab.json and merges.txt in GPT-2's format written
#                 here, covering exactly the model's vocabulary (model.gpt.vocab_size)
#   --tokenizer FILE: the same tokenizer as Hugging Face's tokenizer.json, written here
#   tokenize      --tokenizer: that tokenizer.json with <|endoftext|> added; each --input: a
#                   small file of the documented kind (.txt, .jsonl, .gz) written here; --output:
#                   a folder of the scratch directory
#   tokenize --chat, sample of a llama-family config --tokenizer: a byte-level tokenizer.json
#                   (tests/data/write_byte_tokenizer.py) with the chat template's special tokens
#                   (--chat-template, else llama3 when the documented path names Llama, else
#                   chatml) and reserved ones up to 320 ids, the same file for both; each --input:
#                   a JSONL of 40 conversations
source "$(dirname "$0")/lib.sh"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python3 - "$KILN" "$SRC" "$WORK" "${MPIEXEC:-mpirun}" <<'PY'
import atexit, gzip, json, os, re, shlex, shutil, signal, struct, subprocess, sys, tempfile, time

kiln, src, work, mpiexec = sys.argv[1:5]
SUBCOMMANDS = {"train", "eval", "export", "config", "model", "bench", "autobatch", "plan", "info",
               "replay", "sample", "doctor", "tokenize"}


def code_blocks(path, only_after=None):
    """The lines of the fenced code blocks of a markdown file (after a heading, if given)."""
    lines, inside, active = [], False, only_after is None
    for line in open(path, encoding="utf-8"):
        if only_after is not None and line.startswith("#"):
            active = line.strip() == only_after
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if inside and active:
            lines.append(line.rstrip("\n"))
    joined, pending = [], ""
    for line in lines:  # backslash continuations
        if line.endswith("\\"):
            pending += line[:-1] + " "
        else:
            joined.append(pending + line)
            pending = ""
    return joined


def is_kiln(word):
    return word == "kiln" or word.endswith("/kiln")


def documented_commands():
    sources = [("README.md", code_blocks(os.path.join(src, "README.md"), "## Commands"))]
    docs = os.path.join(src, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            sources.append(("docs/" + name, code_blocks(os.path.join(docs, name))))
    found = []
    for where, lines in sources:
        for line in lines:
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            words = line.split()
            k = next((i for i, w in enumerate(words) if is_kiln(w)), None)
            if k is None or k + 1 >= len(words) or words[k + 1].endswith(":"):
                continue  # not a kiln command (sbatch, cmake), or kiln's output quoted in a doc
            found.append((where, line))
    return found


def variants(line):
    """[--json] → the line without and with the optional part."""
    m = re.search(r"\[([^\]|]*)\]", line)
    if not m:
        return [line]
    return variants(line[:m.start()] + line[m.end():]) + variants(
        line[:m.start()] + m.group(1) + line[m.end():])


def write_cifar10(root):
    os.makedirs(root, exist_ok=True)
    for name in ["data_batch_%d.bin" % i for i in range(1, 6)] + ["test_batch.bin"]:
        with open(os.path.join(root, name), "wb") as f:
            for r in range(16):
                f.write(bytes([r % 10]) + bytes((r * 7 + i) % 256 for i in range(3072)))


# Runs write checkpoints of up to 1 GB (ViT-B/16's weights and AdamW state): in memory when
# there is a /dev/shm, and one directory per config at a time.
RUNS = tempfile.mkdtemp(prefix="kiln-doc-runs-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK)
                        else work)
atexit.register(shutil.rmtree, RUNS, True)
CIFAR = os.path.join(work, "cifar-10-batches-bin")
write_cifar10(CIFAR)


# llm.c's shard format (256 int32: magic, version, count; then uint16 tokens), GPT-2's ids.
def write_fineweb(root):
    os.makedirs(root, exist_ok=True)
    for name in ["fineweb_train_000001.bin", "fineweb_val_000000.bin"]:
        count = 20000
        with open(os.path.join(root, name), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
            f.write(struct.pack("<%dH" % count, *((i * 7919) % 50257 for i in range(count))))


FINEWEB = os.path.join(work, "fineweb10B")
write_fineweb(FINEWEB)
last_train_dir = {}
counter = [0]


def config_stem(args):
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            return os.path.splitext(os.path.basename(args[i + 1]))[0]
        if a.startswith("--config="):
            return os.path.splitext(os.path.basename(a.split("=", 1)[1]))[0]
    return None


def shrink(stem_or_model):
    if stem_or_model == "vit_b16":
        return ["model.image_size=32"]
    if stem_or_model == "resnet50":  # batch norm needs > 1 value per channel at batch 1: 2x2
        return ["model.image_size=64"]
    if stem_or_model == "bert_base":
        return ["model.bert.num_layers=2", "model.bert.seq_len=32", "model.bert.vocab_size=1024"]
    if stem_or_model is not None and stem_or_model.startswith("gpt2"):
        return ["model.gpt.num_layers=2", "model.gpt.hidden_size=64", "model.gpt.num_heads=2",
                "model.gpt.seq_len=64"]
    if is_llama_family(stem_or_model):
        return ["model.llama.num_layers=2", "model.llama.hidden_size=64",
                "model.llama.num_heads=4", "model.llama.num_kv_heads=2",
                "model.llama.intermediate_size=128", "model.llama.seq_len=64",
                "model.llama.max_positions=512", "model.llama.vocab_size=%d" % CHAT_VOCAB]
    return []


def is_llama_family(stem_or_model):
    """Llama and Qwen presets and the configs named after them (sft_qwen2_5_1_5b, ...)."""
    return stem_or_model is not None and re.search(r"llama|qwen", stem_or_model) is not None


def config_and_sets(args):
    """The --config and --set arguments of a command (what makes its experiment)."""
    out, i = [], 0
    while i < len(args):
        if args[i] in ("--config", "--set") and i + 1 < len(args):
            out += args[i:i + 2]
            i += 2
            continue
        if args[i].startswith(("--config=", "--set=")):
            out.append(args[i])
        i += 1
    return out


def write_bpe_files(vocab_size):
    """GPT-2-format vocab.json and merges.txt with ids 0..vocab_size-1: the 256 byte symbols,
    then merges of pairs of them in order, and the same tokenizer as a tokenizer.json. Returns
    the three paths."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    symbol = dict(zip(bs, map(chr, cs)))
    vocab = {symbol[b]: b for b in range(256)}
    letters = [symbol[b] for b in range(256)]
    pairs = [(x, y) for x in letters for y in letters][:max(vocab_size - 256, 0)]
    for i, (x, y) in enumerate(pairs):
        vocab[x + y] = 256 + i
    d = os.path.join(work, "bpe-%d" % vocab_size)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join("%s %s\n" % p for p in pairs))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                   "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
                   "decoder": byte_level,
                   "model": {"type": "BPE", "vocab": vocab, "merges": [list(p) for p in pairs]}},
                  f, ensure_ascii=False)
    return tuple(os.path.join(d, name) for name in ("vocab.json", "merges.txt", "tokenizer.json"))


# Chat models' tokenizers: the 256 bytes, the template's special tokens, reserved tokens up to
# CHAT_VOCAB ids (the shrunk llama family's model.llama.vocab_size: every id decodes).
CHAT_VOCAB = 320
CHAT_SPECIAL = {"chatml": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                           "<|end_header_id|>", "<|eot_id|>"]}
documented_outputs = {}  # a documented tokenize --output -> the scratch folder it went to


def chat_template_of(args, tokenizer):
    """--chat-template when given, else llama3 for a tokenizer under a folder named Llama*."""
    if "--chat-template" in args:
        return args[args.index("--chat-template") + 1]
    return "llama3" if "llama" in tokenizer.lower() else "chatml"


def chat_tokenizer(template):
    path = os.path.join(work, "chat-tokenizer-" + template, "tokenizer.json")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        special = CHAT_SPECIAL[template]
        special += ["<|reserved_special_token_%d|>" % i
                    for i in range(CHAT_VOCAB - 256 - len(special))]
        subprocess.run([sys.executable, os.path.join(src, "tests", "data",
                                                     "write_byte_tokenizer.py"), path] + special,
                       check=True)
    return path


def tokenize_form(args):
    """kiln tokenize's arguments with a tokenizer, a corpus and an output folder written here."""
    counter[0] += 1
    scratch = os.path.join(work, "tokenize-%d" % counter[0])
    os.makedirs(scratch, exist_ok=True)
    chat = "--chat" in args
    tokenizer = write_bpe_files(512)[2]
    with open(tokenizer, encoding="utf-8") as f:
        data = json.load(f)
    data["added_tokens"] = [{"id": 512, "content": "<|endoftext|>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False,
                             "special": True}]
    tokenizer = os.path.join(scratch, "tokenizer.json")
    with open(tokenizer, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("--tokenizer", "--input", "--output") and i + 1 < len(args):
            value = args[i + 1]
            if a == "--tokenizer":
                value = chat_tokenizer(chat_template_of(args, value)) if chat else tokenizer
            elif a == "--output":
                documented = value.rstrip("/")
                value = os.path.join(scratch, os.path.basename(documented) or "out")
                documented_outputs[documented] = value
            else:  # a file of the documented kind
                value = os.path.join(scratch, os.path.basename(value).replace("*", "doc"))
                text = "".join('{"text": "document %d of the corpus"}\n' % k for k in range(20))
                if chat:
                    text = "".join(json.dumps({"messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "question %d?" % k},
                        {"role": "assistant", "content": "answer %d" % k}]}) + "\n"
                        for k in range(40))
                elif ".jsonl" not in value:
                    text = "a text document of the corpus\n" * 20
                data = text.encode("utf-8")
                with open(value, "wb") as f:
                    f.write(gzip.compress(data) if value.endswith(".gz") else data)
            out += [a, value]
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def gpt_vocab_size(args):
    """model.gpt.vocab_size of the experiment these --config/--set arguments make."""
    out = subprocess.run([kiln, "config"] + config_and_sets(args) +
                         ["--set", "train.device=CPU", "--set", "parallel.backend=AUTO",
                          "--set", "precision.opt_level=O0"],
                         cwd=src, capture_output=True, text=True)
    m = re.search(r"gpt\s*\{[^}]*?vocab_size:\s*(\d+)", out.stdout)
    if not m:
        sys.exit("FAIL: no model.gpt.vocab_size in kiln config's output for %s:\n%s%s" %
                 (args, out.stdout, out.stderr))
    return int(m.group(1))


def random_base(args):
    """A transformers folder of the experiment's model made small, random weights: what a
    documented model.init_from=DIR (a downloaded model) becomes."""
    config = args[args.index("--config") + 1]
    stem = config_stem(args)
    path = os.path.join(work, "base-" + stem)
    if not os.path.exists(path):
        sets = ["train.device=CPU", "parallel.backend=AUTO", "precision.opt_level=O0",
                "logging.dir=" + os.path.join(work, "base-run-" + stem)] + shrink(stem)
        out = subprocess.run([kiln, "export", "--config", config, "--random-init", "--hf", path,
                              "--dtype", "fp32"] + [w for s in sets for w in ("--set", s)],
                             cwd=src, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("FAIL: the random model.init_from of %s:\n%s%s" % (config, out.stdout,
                                                                        out.stderr))
    return path


def cpu_form(kiln_args, ranks):
    """The kiln arguments of a documented command in their CPU-feasible form."""
    sub, args = kiln_args[0], kiln_args[1:]
    if sub == "tokenize":
        return [kiln, sub] + tokenize_form(args)
    args = [a.replace("/data/cifar-10-batches-bin", CIFAR).replace("/data/fineweb10B", FINEWEB)
            for a in args]
    stem = config_stem(args)
    sets = []
    # Files a command writes go to the scratch directory, not the source tree it runs in.
    args = [os.path.join(work, os.path.basename(a))
            if i > 0 and args[i - 1] in ("--onnx", "--dump-logits", "--dump-inputs") else a
            for i, a in enumerate(args)]
    if "--hf" in args:  # a new folder each time (kiln export --hf refuses an existing one)
        counter[0] += 1
        i = args.index("--hf") + 1
        args[i] = os.path.join(work, "hf-%d-%s" % (counter[0], os.path.basename(args[i])))
    for i, a in enumerate(args):
        if i == 0 or args[i - 1] != "--set":
            continue
        if a.startswith("data.path="):  # the shards of a documented kiln tokenize
            path = a.split("=", 1)[1]
            for documented, scratch in documented_outputs.items():
                if path.startswith(documented + "/"):
                    args[i] = "data.path=" + scratch + path[len(documented):]
        elif a.startswith("model.init_from="):
            args[i] = "model.init_from=" + random_base(args)
    if sub == "sample" and "--tokenizer" in args and is_llama_family(stem):
        i = args.index("--tokenizer") + 1
        args[i] = chat_tokenizer(chat_template_of(args, args[i]))
    elif sub == "sample" and ("--vocab" in args or "--tokenizer" in args):
        files = dict(zip(("--vocab", "--merges", "--tokenizer"),
                         write_bpe_files(gpt_vocab_size(args))))
        args = [files.get(args[i - 1], a) if i > 0 else a for i, a in enumerate(args)]
    if sub in ("train", "eval", "export", "sample"):
        counter[0] += 1
        if sub == "train" or stem not in last_train_dir:
            run_dir = os.path.join(RUNS, "%s-%d" % (stem, counter[0]))
        else:
            run_dir = last_train_dir[stem]
        if sub == "train":
            if stem in last_train_dir and "--resume" not in args:
                shutil.rmtree(last_train_dir[stem], ignore_errors=True)
            last_train_dir[stem] = run_dir
        sets = ["train.device=CPU", "parallel.backend=AUTO", "precision.opt_level=O0",
                "train.steps=2",
                "schedule.warmup_steps=0", "train.batch_per_gpu=2",
                "train.global_batch=%d" % (2 * ranks), "train.eval_batches=2",
                "data.workers=1", "logging.dir=" + run_dir] + shrink(stem)
    elif sub == "autobatch":
        sets = ["train.device=CPU", "parallel.backend=AUTO", "precision.opt_level=O0",
                "train.max_memory_mb=3072", "data.workers=1",
                "logging.dir=" + os.path.join(work, "autobatch")]
        sets += shrink(stem)
        args += ["--max-batch", "2"]
    elif sub == "plan":
        sets = ["train.device=CPU", "parallel.backend=AUTO", "precision.opt_level=O0",
                "data.workers=1", "logging.dir=" + os.path.join(work, "plan")] + shrink(stem)
    elif sub == "config":
        sets = ["train.device=CPU", "parallel.backend=AUTO", "precision.opt_level=O0"]
    elif sub == "bench":
        out, skip = [], False
        model = None
        for i, a in enumerate(args):
            if skip:
                skip = False
                continue
            if a in ("--batch", "--amp", "--half", "--steps", "--warmup", "--device"):
                skip = True
                continue
            if a == "--model":
                model = args[i + 1]
            out.append(a)
        args = out + ["--batch", "2", "--amp", "O0", "--steps", "1", "--warmup", "0",
                      "--device", "cpu"]
        sets = shrink(model)
    elif sub == "doctor":
        counter[0] += 1
        scratch = os.path.join(work, "doctor-%d" % counter[0])
        os.makedirs(scratch, exist_ok=True)
        if "--dir" in args:
            args = [scratch if i > 0 and args[i - 1] == "--dir" else a for i, a in enumerate(args)]
        elif stem is not None:
            sets = ["logging.dir=" + scratch]
        else:
            args += ["--dir", scratch]
        args += ["--write-mb", "8", "--max-mb", "1"]
        # This machine has no GPU: a CUDA build's doctor fails the world check without one
        # (issue 32), so the documented command is checked as a CPU job, as bench is.
        if "--device" not in args:
            args += ["--device", "cpu"]
    for s in sets:
        args += ["--set", s]
    return [kiln, sub] + args


def runnable(line, where):
    words = shlex.split(line)
    env = dict(os.environ)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    k = next(i for i, w in enumerate(words) if is_kiln(w))
    if words[k] != "build/bin/kiln":
        return None, None, ("calls %s, which the quick start does not put on PATH: write "
                            "build/bin/kiln" % words[k])
    launcher, kiln_args = words[:k], words[k + 1:]
    if kiln_args[0] not in SUBCOMMANDS:
        return None, None, "unknown subcommand '%s'" % kiln_args[0]
    ranks = 1
    if launcher:
        out, i = [], 0
        while i < len(launcher):
            w = launcher[i]
            if w in ("-np", "-n") and i + 1 < len(launcher):
                ranks = min(int(launcher[i + 1]), 2)
                out += [w, str(ranks)]
                i += 2
                continue
            if w == "--hostfile":
                i += 2
                continue
            out.append(w)
            i += 1
        launcher = out
        if os.path.basename(launcher[0]) == "mpirun":
            launcher = [mpiexec, "--allow-run-as-root", "--oversubscribe"] + launcher[1:]
        elif launcher[0].endswith("kiln-mpirun"):
            launcher[0] = os.path.join(src, "launch", "kiln-mpirun")
            env["MPIRUN"] = mpiexec
        else:
            return None, None, "unknown launcher " + launcher[0]
    resumes = kiln_args[0] == "train" and "--resume" in kiln_args
    resumes_own_run = resumes and config_stem(kiln_args) not in last_train_dir
    runs = []
    if (kiln_args[0] == "sample" and config_stem(kiln_args) not in last_train_dir and
            where != "README.md"):
        # Sampling needs trained weights: the experiment trains first (before the sample's CPU
        # form, which reads that run's directory).
        runs.append(launcher + cpu_form(["train"] + config_and_sets(kiln_args[1:]), ranks))
    argv = launcher + cpu_form(kiln_args, ranks)
    runs.append(argv)
    if resumes_own_run:
        # "Continue from a checkpoint" presumes a run before it: the same command without
        # --resume first, into the same directory.
        i = argv.index("--resume")
        runs.insert(0, argv[:i] + argv[i + 2:])
    return runs, env, None


commands = documented_commands()
subcommands = {shlex.split(l)[next(i for i, w in enumerate(shlex.split(l)) if is_kiln(w)) + 1]
               for _, l in commands}
if len(commands) < 15 or not {"train", "eval", "autobatch", "bench", "config"} <= subcommands:
    sys.exit("FAIL: found only %d documented commands (%s): is the extraction broken?" %
             (len(commands), ", ".join(sorted(subcommands))))
failures = []
start = time.time()
seen = set()
for where, line in commands:
    for variant in variants(line):
        # The same command shown in two places runs once (build/bin/kiln and kiln alike).
        key = " ".join("kiln" if is_kiln(w) else w for w in variant.split())
        if key in seen:
            print("%-18s   --   same as above  %s" % (where, variant), flush=True)
            continue
        seen.add(key)
        runs, env, problem = runnable(variant, where)
        if problem:
            failures.append((where, variant, problem))
            continue
        t0 = time.time()
        log = os.path.join(work, "last.log")
        for argv in runs:
            with open(log, "w") as out:
                p = subprocess.Popen(argv, env=env, cwd=src, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
                try:
                    code = p.wait(timeout=150)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    code = "timeout"
            if code != 0:
                break
        took = time.time() - t0
        print("%-18s %5.1fs exit %-4s %s" % (where, took, code, variant), flush=True)
        if code != 0:
            text = open(log).read()
            print("    ran: " + " ".join(shlex.quote(a) for a in argv))
            print("    " + "\n    ".join(text.strip().splitlines()[-15:]))
            failures.append((where, variant, "exit %s" % code))
print("%d documented commands in %.0f s" % (len(commands), time.time() - start))
if failures:
    for where, line, why in failures:
        print("FAIL: %s: %s (%s)" % (where, line, why))
    sys.exit(1)
PY
pass "every documented kiln command runs"
