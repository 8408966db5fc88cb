/**
 * A helper process of the inference server's prompt pool (prompts.ts): renders chat templates and
 * tokenizes prompts, so that neither a megabyte prompt nor a template that loops blocks the
 * server's event loop. It loads the same tokenizer folder (argv[2]) with the same class as the
 * server, so ids are identical. Only ids (or a short refusal) go back: a rendered text of
 * megabytes never crosses to the server. It exits when the server goes away (its IPC channel closes).
 */
import { serveTasks } from '../helper-pool';
import { renderChat } from '../model/chat';
import { Tokenizer } from '../model/tokenizer';
import type { PromptAnswer, PromptTask } from './prompts';

const tokenizer = Tokenizer.fromDir(process.argv[2]);

function run(task: PromptTask): PromptAnswer {
  if (task.kind === 'encode') return { ids: tokenizer.encode(task.text) };
  let text: string;
  try {
    text = renderChat(tokenizer, task.messages, task.options);
  } catch (e) {
    return { refused: 'template', message: (e as Error).message };
  }
  if (text.length > task.maxChars) return { refused: 'too_large', chars: text.length };
  const atLeast = tokenizer.minTokens(text);
  if (atLeast >= task.contextLength) return { refused: 'context', atLeast };
  return { ids: tokenizer.encode(text) };
}

// A task that throws answers `{error}` (prompt-supervisor.ts); its helper lives on.
serveTasks(run);
