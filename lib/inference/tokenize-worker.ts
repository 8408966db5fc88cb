/**
 * A worker thread that tokenizes long prompts for the inference server (tokenize.ts), so that
 * seconds of tokenization never block the server's event loop. It loads the same tokenizer folder
 * with the same class as the server, so ids are identical.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { Tokenizer } from '../model/tokenizer';

const tokenizer = Tokenizer.fromDir((workerData as { dir: string }).dir);
parentPort!.on('message', ({ id, text }: { id: number; text: string }) => {
  try {
    const ids = Int32Array.from(tokenizer.encode(text));
    parentPort!.postMessage({ id, ids }, [ids.buffer]);
  } catch (e) {
    parentPort!.postMessage({ id, error: (e as Error).message });
  }
});
