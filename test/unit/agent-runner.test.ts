import { sdkOptions, sessionIdOf } from '../../sandbox/runners/agent';
import { parseRunnerSetting } from '../../services/agents/agent-sessions';

describe('the Claude Agent SDK runner', () => {
  it('passes the session options, the sandbox environment and resume to query()', () => {
    const env = { ANTHROPIC_API_KEY: 'sk-test', PATH: '/usr/bin' };
    const o = sdkOptions(
      {
        prompt: 'not an option',
        model: 'claude-sonnet-4-5',
        systemPrompt: 'be brief',
        allowedTools: ['Read', 'Bash'],
        permissionMode: 'acceptEdits',
        maxTurns: 4,
        cwd: '/workspace/app',
        mcpServers: {
          fs: { command: 'mcp-fs', args: ['--root', '/'], env: { DEBUG: '1' } },
          web: { url: 'https://mcp.example/sse', type: 'sse', headers: { authorization: 'x' } },
        },
        resume: 'sess-from-request',
      },
      env,
    );
    expect(o).toEqual({
      env: { ANTHROPIC_API_KEY: 'sk-test', PATH: '/usr/bin' },
      model: 'claude-sonnet-4-5',
      systemPrompt: 'be brief',
      allowedTools: ['Read', 'Bash'],
      tools: ['Read', 'Bash'],
      permissionMode: 'acceptEdits',
      maxTurns: 4,
      cwd: '/workspace/app',
      mcpServers: {
        fs: { type: 'stdio', command: 'mcp-fs', args: ['--root', '/'], env: { DEBUG: '1' } },
        web: { type: 'sse', url: 'https://mcp.example/sse', headers: { authorization: 'x' } },
      },
      resume: 'sess-from-request',
    });
    expect(o.env).not.toBe(env);
  });

  it('resumes the conversation of the previous turn and leaves unset options out', () => {
    const o = sdkOptions({ resume: 'old' }, { PWD: '/workspace' }, 'sess-of-last-turn');
    expect(o).toEqual({ env: { PWD: '/workspace' }, cwd: '/workspace', resume: 'sess-of-last-turn' });
    expect(sdkOptions({}, {})).toEqual({ env: {}, cwd: '/workspace' });
  });

  it('restricts the built-in tools to those allowedTools names, and approves the list as given', () => {
    expect(sdkOptions({ allowedTools: ['Bash(git:*)', 'Read', 'mcp__fs__read', 'Bash(ls)'] }, {})).toMatchObject({
      allowedTools: ['Bash(git:*)', 'Read', 'mcp__fs__read', 'Bash(ls)'],
      tools: ['Bash', 'Read'],
    });
    expect(sdkOptions({ allowedTools: [] }, {})).toMatchObject({ allowedTools: [], tools: [] });
    expect(sdkOptions({}, {})).not.toHaveProperty('tools');
  });

  it('opts in to skipping permissions only with bypassPermissions', () => {
    expect(sdkOptions({ permissionMode: 'bypassPermissions' }, {})).toMatchObject({
      permissionMode: 'bypassPermissions',
      allowDangerouslySkipPermissions: true,
    });
    expect(sdkOptions({ permissionMode: 'plan' }, {})).not.toHaveProperty('allowDangerouslySkipPermissions');
  });

  it('finds the session id on events', () => {
    expect(sessionIdOf({ type: 'system', subtype: 'init', session_id: 'abc' })).toBe('abc');
    expect(sessionIdOf({ type: 'ready', sessionId: 'def' })).toBe('def');
    expect(sessionIdOf({ type: 'assistant' })).toBeUndefined();
    expect(sessionIdOf({ session_id: 42 })).toBeUndefined();
    expect(sessionIdOf(null)).toBeUndefined();
  });

  it('reads AGENT_RUNNER as a JSON argv or a command line', () => {
    expect(parseRunnerSetting(undefined)).toBeUndefined();
    expect(parseRunnerSetting('  ')).toBeUndefined();
    expect(parseRunnerSetting('python3 /opt/runner.py --flag')).toEqual(['python3', '/opt/runner.py', '--flag']);
    expect(parseRunnerSetting('["node", "/opt/my runner.js"]')).toEqual(['node', '/opt/my runner.js']);
    expect(() => parseRunnerSetting('[1, 2]')).toThrow(/AGENT_RUNNER/);
  });
});
