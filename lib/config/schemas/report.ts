/** `report`: the run whose report.html to write. */
import { z } from 'zod';
import { outputDir } from './common';

export const reportSchema = z.strictObject({
  run: z
    .string()
    .min(1)
    .describe('run name (a folder of output_dir) or a run folder path; also accepted as the first argument'),
  output_dir: outputDir(),
});

/** The run folder a report names: an existing path as given, else `<output_dir>/<run>`. */
export function reportRunDir(c: z.output<typeof reportSchema>): string {
  return c.run.includes('/') ? c.run : `${c.output_dir}/${c.run}`;
}
