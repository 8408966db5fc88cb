/**
 * Run-folder entries as plain strings, so workflow code (which cannot import `node:path`) names the
 * same paths as `RunLayout` (lib/runfolder/layout.ts), which joins these onto the folder.
 */

/** Weights of policy version `version` (written by train step version-1), relative to the run folder. */
export const weightsEntry = (version: number): string => `weights/step_${version}`;

/** `entry` inside `runDir` (a path as activities return it: absolute, '/'-separated). */
export const inRun = (runDir: string, entry: string): string => `${runDir.replace(/\/+$/, '')}/${entry}`;
