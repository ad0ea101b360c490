import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

/** Search attributes set on every session workflow, to filter sessions in the Temporal UI. */
export const AGENT_ID = defineSearchAttributeKey('AgentId', SearchAttributeType.KEYWORD);
export const SESSION_STATUS = defineSearchAttributeKey('SessionStatus', SearchAttributeType.KEYWORD);
export const ORG_ID = defineSearchAttributeKey('OrgId', SearchAttributeType.KEYWORD);

/** Every custom search attribute, as `name=Type` for `temporal server start-dev --search-attribute`. */
export const SEARCH_ATTRIBUTE_FLAGS = ['AgentId=Keyword', 'SessionStatus=Keyword', 'OrgId=Keyword', 'BatchId=Keyword'];

/** Set on a batch's workflow and on each of its sessions' workflows, to filter them together. */
export const BATCH_ID = defineSearchAttributeKey('BatchId', SearchAttributeType.KEYWORD);
