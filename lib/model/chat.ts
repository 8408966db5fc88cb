/**
 * Chat templates: render a model folder's Jinja chat template the way transformers'
 * `apply_chat_template` does (same variables, rendered by `@huggingface/jinja`), and the ChatML
 * template our own models ship with.
 */
import { Template } from '@huggingface/jinja';
import type { Tokenizer } from './tokenizer';

export interface ToolCall {
  id?: string;
  type?: 'function';
  function: { name: string; arguments: string | Record<string, unknown> };
}

/** An OpenAI-style message; extra fields are passed through to the template. */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool' | (string & {});
  content: string | null;
  reasoning_content?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  name?: string;
  [key: string]: unknown;
}

export interface ChatRenderOptions {
  /** OpenAI-style tool definitions (`{type: 'function', function: {name, description, parameters}}`), passed through. */
  tools?: readonly unknown[];
  /** Append the opening of an assistant turn (`<|im_start|>assistant\n` in ChatML). */
  addGenerationPrompt?: boolean;
  /** Passed as `enable_thinking` only when set, so templates can test `enable_thinking is defined`. */
  enableThinking?: boolean;
  /** Further template variables (transformers' `**kwargs` to apply_chat_template). */
  extra?: Record<string, unknown>;
}

/**
 * ChatML as Qwen writes it (tools listed in the system turn, `<tool_call>` JSON in assistant turns,
 * tool results as `<tool_response>` blocks in a user turn), with one deliberate difference from
 * Qwen3's template: reasoning in earlier assistant turns is kept, not stripped. Stripping would
 * change the tokens of past turns as a conversation grows, so a rendered prefix would no longer be
 * a token prefix of the full conversation: SFT masks rely on that, and a multi-turn rollout would
 * be split into several samples (lib/orchestrator/token-rollout.ts).
 */
export const CHATML_TEMPLATE = `{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'user' or message.role == 'system' %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
        {%- endif %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('unknown message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}`;

/**
 * Parsed templates by source text: parsing dominates rendering time and folders reuse one template.
 * A process renders a handful (one per model folder); the oldest go beyond that, so a stream of
 * distinct templates cannot grow it without bound.
 */
const compiled = new Map<string, Template>();
const COMPILED_MAX = 16;

function compile(template: string): Template {
  let t = compiled.get(template);
  if (!t) {
    t = new Template(template);
    if (compiled.size >= COMPILED_MAX) compiled.delete(compiled.keys().next().value!);
    compiled.set(template, t);
  }
  return t;
}

/**
 * Renders `template` with the variables transformers' `apply_chat_template` provides: `messages`,
 * `tools`, `add_generation_prompt`, the special-token strings (`bos_token`, `eos_token`, ...) and
 * any extra kwargs. The jinja package itself defines transformers' globals (`raise_exception`,
 * `strftime_now`).
 */
export function renderChatTemplate(
  template: string,
  messages: readonly ChatMessage[],
  opts: ChatRenderOptions & { specialTokens?: Record<string, string> } = {},
): string {
  if (messages.length === 0) throw new Error('chat template: no messages to render');
  const vars: Record<string, unknown> = {
    ...opts.specialTokens,
    ...opts.extra,
    messages,
    add_generation_prompt: opts.addGenerationPrompt ?? false,
  };
  if (opts.tools !== undefined && opts.tools.length > 0) vars.tools = opts.tools;
  if (opts.enableThinking !== undefined) vars.enable_thinking = opts.enableThinking;
  return compile(template).render(vars);
}

/** Renders with the tokenizer's own chat template. */
export function renderChat(
  tokenizer: Tokenizer,
  messages: readonly ChatMessage[],
  opts: ChatRenderOptions = {},
): string {
  if (tokenizer.chatTemplate === undefined)
    throw new Error('tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)');
  return renderChatTemplate(tokenizer.chatTemplate, messages, { ...opts, specialTokens: tokenizer.specialTokensMap });
}

/** Renders and tokenizes (without adding special tokens: the template writes them), as transformers does. */
export function applyChatTemplate(
  tokenizer: Tokenizer,
  messages: readonly ChatMessage[],
  opts: ChatRenderOptions = {},
): number[] {
  return tokenizer.encode(renderChat(tokenizer, messages, opts));
}
