/** `prime-rl report <run>`: the run's metrics, timeline, configs and evals as one offline HTML page. */
import * as path from 'node:path';
import { writeFileAtomic } from '../atomic';
import { loadReportData } from './data';
import { renderReportHtml } from './html';

export { loadReportData, type ReportData } from './data';
export { renderReportHtml } from './html';

/** Writes `<runDir>/report.html` (atomically) and returns its path. */
export function writeReport(runDir: string): string {
  const file = path.join(path.resolve(runDir), 'report.html');
  writeFileAtomic(file, renderReportHtml(loadReportData(runDir)));
  return file;
}
