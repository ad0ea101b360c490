import { CreateConversationBody, EventsQuery, ForkBody, eventLevel, levelsUpTo, turnSummary } from '../../contract/conversations';

describe('conversation contract', () => {
  test('event levels: what a person reads is user, tool use is progress, the runner’s chatter internal; a level includes the ones above it', () => {
    expect(['assistant', 'result', 'message', 'turn_complete', 'error'].map(eventLevel)).toEqual(['user', 'user', 'user', 'user', 'user']);
    expect(['tool_use', 'system', 'user', 'something_new'].map(eventLevel)).toEqual(['progress', 'progress', 'progress', 'progress']);
    expect(['ready', 'stderr'].map(eventLevel)).toEqual(['internal', 'internal']);
    expect(levelsUpTo('user')).toEqual(['user']);
    expect(levelsUpTo('progress')).toEqual(['user', 'progress']);
    expect(levelsUpTo('internal')).toEqual(['user', 'progress', 'internal']);
  });

  test("a turn's summary is its message's first line, cut at 80 characters, and its yield reason once known", () => {
    expect(turnSummary(3, 'fix the build\nthen run the tests')).toBe('turn 3: fix the build');
    expect(turnSummary(3, 'fix the build', 'completed')).toBe('turn 3: fix the build · completed');
    const long = turnSummary(1, 'x'.repeat(500), 'needs_input');
    expect(long).toBe(`turn 1: ${'x'.repeat(79)}… · needs_input`);
  });

  test('bounds: messages, limits, forks and pages are refused past their maxima', () => {
    expect(CreateConversationBody.safeParse({ input: 'x'.repeat(64 * 1024 + 1) }).success).toBe(false);
    expect(CreateConversationBody.safeParse({ limits: { turns: 501 } }).success).toBe(false);
    expect(CreateConversationBody.safeParse({ limits: { turnSeconds: 3601 } }).success).toBe(false);
    expect(CreateConversationBody.parse({}).limits).toEqual({ turnSeconds: 600, turns: 100 });
    expect(ForkBody.safeParse({ turn: 1, count: 9 }).success).toBe(false);
    expect(ForkBody.safeParse({ turn: 1, evaluate: 'npm test' }).success).toBe(false);
    expect(ForkBody.safeParse({ turn: 1, input: 'go', evaluate: 'npm test', count: 5 }).success).toBe(true);
    expect(EventsQuery.safeParse({ limit: '501' }).success).toBe(false);
    expect(EventsQuery.parse({})).toEqual({ after: 0, level: 'progress', limit: 200 });
  });
});
