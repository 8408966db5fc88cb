/** Run folders with batches of random rollouts, for tests of the trainer on its own. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Rng } from '../../lib/model/rng';
import { buildSample } from '../../lib/orchestrator/sample';
import { writeBatch } from '../../lib/runfolder/batch';
import { RunLayout } from '../../lib/runfolder/layout';
import { packSamples } from '../../lib/runfolder/packing';

/** A run folder at `dir` with `steps` batches (rows of 64) of random rollouts: prompt + completion with logprobs. */
export function randomBatches(dir: string, steps: number): RunLayout {
  const layout = new RunLayout(dir);
  const rng = new Rng(7);
  for (let s = 0; s < steps; s++) {
    const samples = Array.from({ length: 4 }, (_, i) => {
      const prompt = Array.from({ length: 5 + rng.int(5) }, () => rng.int(256));
      const completion = Array.from({ length: 3 + rng.int(8) }, () => rng.int(256));
      const logprobs = completion.map(() => -1 - rng.uniform() * 4);
      return buildSample(
        [
          { tokens: prompt, generated: false },
          { tokens: completion, generated: true, logprobs },
        ],
        i % 2 ? 0.5 : -0.5,
      );
    });
    const { rows, counts } = packSamples(samples, 64);
    fs.mkdirSync(path.dirname(layout.batchFile(s)), { recursive: true });
    writeBatch(layout.batchFile(s), s, 64, rows, counts);
  }
  return layout;
}
