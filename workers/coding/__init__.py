"""Composer-style repository tasks and the machinery under the `coding_agent` environment (issue 17).

Design record (decisions taken here, so every module agrees on them):

Tasks. A repository task (`task.RepoTask`, JSONL schema "repo_task/v1") is: an instruction written as a user
would write it; a repository snapshot (a canonical tar.gz archive, content-hashed with sha256 over its files, not
its bytes); hidden tests (test files the agent never sees, added to the workspace after `finish`, a test command,
and the pytest node ids that must go from failing to passing, `fail_to_pass`, and those that must keep passing,
`pass_to_pass`, as SWE-bench records them); an optional reference patch (unified diff against the snapshot); the
family (repair / implement / imported / session) and provenance (generated / imported / promoted, with ids).
A stored row names its snapshot by {"sha256", "uri"}; an imported row may instead give the files inline
({"repo": {"files": {path: text}}}) or an archive inside the uploaded bundle ({"snapshot_path": ...}).

Modules:
  archive      canonical tar.gz snapshots: pack, safe unpack (absolute paths, '..', device files, links leaving
               the tree, oversize: refused with the reason), content hash
  workspace    copy-on-write workspaces over a snapshot: reads fall through to the snapshot, writes land in the
               workspace's own layer; fork() is O(1) (the current layer is frozen and shared by both children)
  patches      unified diffs: apply one to a workspace (exact context, a clear error when a hunk does not fit),
               make one from two file maps
  execute      run a shell command against a workspace in workers.sandbox (time, memory, output and disk limits);
               files the command changed come back into the workspace
  hidden_tests run a task's hidden tests on a copy of a workspace in a fresh sandbox; per-test outcomes
  verify       a task is kept only if its fail_to_pass tests fail on the snapshot and every hidden test passes with
               the reference patch
  generate     the task generator (repair: procedural mutations; implement: a removed body), over library source
               distributions vendored under sources/
  scripted     a coding agent written as code that solves a task from its reference patch through the real tools
               (the SFT teacher on machines without a large model)
"""
