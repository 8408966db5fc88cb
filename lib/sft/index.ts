/** Supervised fine-tuning data: datasets (JSONL or environment demonstrations), loss masks, step batches. */
export type { SftConversation } from './conversation';
export { parseSftRow, readSftJsonl } from './jsonl';
export { envConversations } from './env-data';
export { tokenizeConversation } from './tokenize';
export { loadSftConversations, loadSftDataset, type SftDataOptions, type SftDataset, type SftDataSource } from './data';
export { SftSchedule, type SftScheduleOptions, type SftStepBatch } from './schedule';
