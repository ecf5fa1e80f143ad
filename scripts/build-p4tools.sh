#!/usr/bin/env bash
# Build the P4 tools the bmv2 target uses, at pinned versions, into PREFIX (`make p4tools`).
#
#   make p4tools PREFIX=/opt/p4tools-grpc                    # from the upstream repositories
#   make p4tools PREFIX=/opt/p4tools-grpc SRC=/srv/mirrors   # from local git mirrors
#   make p4tools PREFIX=/opt/p4c-dpdk PARTS=p4c P4C_BACKENDS=dpdk
#
# What (PARTS, comma-separated; default p4c,pi,bmv2), in this order:
#   p4c   p4lang/p4c v1.2.4.8: the `p4c` driver and the backends of P4C_BACKENDS (default bmv2;
#         any of bmv2, dpdk, p4test: bmv2 gives p4c-bm2-ss, dpdk gives p4c-dpdk). Its CMake
#         FetchContent source, p4lang/p4runtime at p4c's own pin, is checked out from SRC too.
#   pi    p4lang/PI at the commit behavioral-model 1.15.5 was released against, with the
#         submodules the gRPC server build reads (p4lang/p4runtime, openconfig/gnmi,
#         troydhanson/uthash, google/googletest) at PI's own pins: the P4Runtime server library.
#   bmv2  p4lang/behavioral-model 1.15.5 (CMake): Thrift on, PI/gRPC on (simple_switch_grpc;
#         needs pi in PREFIX), nanomsg off; with BMV2_FAST=1 (default) also the performance
#         build p4lang's notes recommend (-DENABLE_LOGGING_MACROS=OFF -DENABLE_ELOGGER=OFF,
#         Release): `--log-level` debug/trace lines and the event logger are compiled out.
#
# SRC: a URL base (default https://github.com: OWNER/NAME is appended) or a folder of git
# mirrors, where OWNER/NAME, OWNER/NAME.git, OWNER+NAME/repo, OWNER+NAME, NAME or NAME.git is
# taken, whichever exists (a bare or a working repository). Every repository above, submodules
# and FetchContent sources included, comes from SRC: nothing else is downloaded but Debian
# packages. A mirror may lack large files that no build reads (p4c's
# docs/compiler-design.pptx): checkouts leave them out.
#
# Other settings: JOBS (parallel compiles, default nproc), WORK (sources and build trees,
# default PREFIX/src; KEEP_WORK=0 deletes it after a successful build), BMV2_FAST (1).
# Debian packages needed to build (compilers, CMake, autotools, Boost, gRPC/protobuf/Thrift
# -dev, ...) are installed with apt-get when missing (root), else listed with the command.
# PREFIX/BUILDINFO records versions, commits, flags, the source, and each part's time and size.
# This script is never run by `make demo` or `make test`; nothing it fetches is committed.
set -euo pipefail

die() { echo "build-p4tools: $*" >&2; exit 1; }
usage() { echo "build-p4tools: $*" >&2; exit 2; }

PREFIX=${PREFIX:-}
[ -n "$PREFIX" ] || usage "PREFIX is required (where to install): make p4tools PREFIX=/opt/p4tools-grpc [SRC=URL|DIR]"
case "$PREFIX" in /*) ;; *) usage "PREFIX must be an absolute path, got '$PREFIX'";; esac
SRC=${SRC:-https://github.com}
SRC=${SRC%/}
PARTS=${PARTS:-p4c,pi,bmv2}
P4C_BACKENDS=${P4C_BACKENDS:-bmv2}
JOBS=${JOBS:-$(nproc)}
WORK=${WORK:-$PREFIX/src}
KEEP_WORK=${KEEP_WORK:-1}
BMV2_FAST=${BMV2_FAST:-1}

# ---- pinned versions: repository, commit (and the tag it carries)
P4C_REPO=p4lang/p4c;                 P4C_COMMIT=32893b7e879db9e1c368d3568d41cb3d20c034d0; P4C_TAG=v1.2.4.8
P4C_P4RUNTIME_COMMIT=1e771c4e05c4e7e250df00212b3ca02ee3202d71   # p4c's FetchContent pin (CMakeLists.txt)
BMV2_REPO=p4lang/behavioral-model;   BMV2_COMMIT=693e69e634fedf007964a069fdd69acc441a5f80; BMV2_TAG=1.15.5
PI_REPO=p4lang/PI;                   PI_COMMIT=f96af95e090619491e3abf2df69df340c2c9cb46
# PI's submodules the server build reads (path in PI, repository); commits: PI's gitlinks
# (googletest: PI's configure insists on it with --with-proto)
PI_SUBMODULES="proto/p4runtime=p4lang/p4runtime proto/openconfig/gnmi=openconfig/gnmi third_party/uthash=troydhanson/uthash
third_party/googletest=google/googletest"
# files absent from some mirrors that no build reads (left out of every checkout)
SPARSE_EXCLUDE="docs/compiler-design.pptx"

# ---- Debian packages to build (not needed by embnic at run time; the binaries' shared
# libraries come with them)
BUILD_PKGS="git ca-certificates g++ make cmake autoconf automake libtool pkg-config bison flex
libfl-dev libboost-dev libboost-iostreams-dev libboost-program-options-dev libboost-system-dev
libboost-filesystem-dev libboost-thread-dev libgc-dev libgmp-dev libpcap-dev libjsoncpp-dev
libxxhash-dev libthrift-dev thrift-compiler libprotobuf-dev protobuf-compiler libgrpc++-dev
protobuf-compiler-grpc libnanomsg-dev python3"
# (libnanomsg-dev: behavioral-model's CMake build compiles its test library, which includes
# nanomsg's header, even with nanomsg off; nothing installed links it)

IFS=, read -r -a parts <<<"$PARTS"
for p in "${parts[@]}"; do
    case "$p" in p4c|pi|bmv2) ;; *) usage "PARTS: unknown part '$p' (p4c, pi, bmv2)";; esac
done
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }
IFS=, read -r -a backends <<<"$P4C_BACKENDS"
for b in "${backends[@]}"; do
    case "$b" in bmv2|dpdk|p4test) ;; *) usage "P4C_BACKENDS: unknown backend '$b' (bmv2, dpdk, p4test)";; esac
done
has_backend() { [[ ",$P4C_BACKENDS," == *",$1,"* ]]; }
if has_part bmv2 && ! has_part pi && [ ! -e "$PREFIX/include/PI/pi.h" ]; then
    usage "PARTS=$PARTS: bmv2 is built with PI (simple_switch_grpc): add pi, or build it into $PREFIX first"
fi

# ---- build packages
missing=()
for p in $BUILD_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        die "missing Debian packages to build: ${missing[*]}; run as root or: apt-get install ${missing[*]}"
    fi
    echo "build-p4tools: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- sources
# repo_url OWNER/NAME: where to clone it from, under SRC
repo_url() {
    local owner=${1%%/*} name=${1#*/} c
    if [ -d "$SRC" ]; then
        for c in "$SRC/$owner/$name" "$SRC/$owner/$name.git" "$SRC/$owner+$name/repo" "$SRC/$owner+$name" \
                 "$SRC/$name" "$SRC/$name.git"; do
            if [ -e "$c/HEAD" ] || [ -e "$c/.git" ]; then echo "$c"; return 0; fi
        done
        die "no git mirror of $1 in $SRC (looked for $owner/$name[.git], $owner+$name[/repo], $name[.git])"
    fi
    case "$SRC" in
        *://*|*@*:*) echo "$SRC/$owner/$name" ;;
        *) usage "SRC '$SRC' is neither a folder nor a URL (https://..., git@host:...)" ;;
    esac
}

# checkout OWNER/NAME COMMIT DIR: DIR holds the repository's files at COMMIT (and nothing else
# of it: an existing DIR at another commit is checked out anew)
checkout() {
    local repo=$1 commit=$2 dir=$3 url
    url=$(repo_url "$repo")
    if [ -e "$dir/.git" ] && [ "$(git -C "$dir" rev-parse HEAD 2>/dev/null)" = "$commit" ]; then
        echo "build-p4tools: $repo at ${commit:0:10} already in $dir"
        return 0
    fi
    rm -rf "$dir"
    echo "build-p4tools: $repo ${commit:0:10} from $url"
    if [ -d "$url" ]; then  # a local mirror: plain clone (objects copied; a partial clone needs file://)
        git clone -q --no-checkout "$url" "$dir"
    else                    # a server: no blob before checkout needs it
        git clone -q --no-checkout --filter=blob:none "$url" "$dir"
    fi
    git -C "$dir" cat-file -e "$commit^{commit}" 2>/dev/null || git -C "$dir" fetch -q origin "$commit" \
        || die "$repo: commit $commit not in $url"
    # the patterns written directly (`git sparse-checkout set` would first check out the default
    # branch, blobs a mirror lacks included)
    git -C "$dir" config core.sparseCheckout true
    mkdir -p "$(git -C "$dir" rev-parse --absolute-git-dir)/info"
    { echo '/*'; printf '!/%s\n' $SPARSE_EXCLUDE; } >"$(git -C "$dir" rev-parse --absolute-git-dir)/info/sparse-checkout"
    # (a mirror lacking a left-out blob makes the index's cache-tree complain: not an error here)
    local err
    err=$(git -C "$dir" -c advice.detachedHead=false checkout -q "$commit" 2>&1) \
        || die "$repo: checkout of $commit failed in $dir: $err"
    [ "$(git -C "$dir" rev-parse HEAD)" = "$commit" ] || die "$repo: checkout of $commit failed in $dir"
}

mkdir -p "$PREFIX" "$WORK"
PREFIX=$(cd "$PREFIX" && pwd); WORK=$(cd "$WORK" && pwd)
export PATH="$PREFIX/bin:$PATH"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export CPATH="$PREFIX/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$PREFIX/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LOG=$WORK/logs
mkdir -p "$LOG"

# step NAME LOGFILE CMD...: run CMD with its output in LOGFILE; on failure quote its end
step() {
    local name=$1 log=$2; shift 2
    echo "build-p4tools: $name (log: $log)"
    if ! "$@" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "$name failed; full log: $log"
    fi
}

# cpu_seconds: sets CPU to the CPU time (user + system, seconds) of this script's finished
# children so far (`times` in this shell: in a $(...) subshell it would count that subshell's)
cpu_seconds() {
    times >"$WORK/.times"
    CPU=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] }
                         printf "%d", n }' "$WORK/.times")
}

# write_buildinfo: PREFIX/BUILDINFO from the part lines recorded so far (this run's and earlier
# runs' parts), the tools' versions and the disk use; written after each part, so a later
# part's failure keeps what was built
write_buildinfo() {
    local old="" p t
    [ -e "$PREFIX/BUILDINFO" ] && old=$(grep '^part ' "$PREFIX/BUILDINFO" || true)
    {
        echo "# embnic p4tools (scripts/build-p4tools.sh), $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
        echo "prefix $PREFIX"
        echo "src $SRC"
        echo "jobs $JOBS ($(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg))"
        for p in p4c pi bmv2; do
            if [ -n "${done_parts[$p]:-}" ]; then echo "${done_parts[$p]}"
            else grep "^part $p " <<<"$old" || true; fi
        done
        for t in p4c p4c-bm2-ss p4c-dpdk simple_switch simple_switch_grpc; do
            [ -x "$PREFIX/bin/$t" ] && echo "version $t $("$PREFIX/bin/$t" --version 2>&1 | tail -n 1)"
        done
        echo "disk prefix_mb=$(du -sm --exclude="$WORK" "$PREFIX" | cut -f1) work_mb=$(du -sm "$WORK" | cut -f1)"
    } >"$PREFIX/BUILDINFO.tmp"
    mv "$PREFIX/BUILDINFO.tmp" "$PREFIX/BUILDINFO"
}

declare -A done_parts
# record PART WALL0 CPU0 WHAT: a part just built (wall and CPU seconds since WALL0/CPU0), into BUILDINFO
record() {
    cpu_seconds
    done_parts[$1]="part $1 seconds=$((SECONDS - $2)) cpu_seconds=$((CPU - $3)) $4"
    write_buildinfo
}

# ---- p4c
build_p4c() {
    local t0=$SECONDS c0 src=$WORK/p4c bld=$WORK/p4c/build flags=()
    cpu_seconds; c0=$CPU
    checkout "$P4C_REPO" "$P4C_COMMIT" "$src"
    checkout p4lang/p4runtime "$P4C_P4RUNTIME_COMMIT" "$WORK/p4c-p4runtime"
    grep -q "GIT_TAG *$P4C_P4RUNTIME_COMMIT" "$src/CMakeLists.txt" \
        || die "p4c's CMakeLists.txt no longer pins p4runtime $P4C_P4RUNTIME_COMMIT: update P4C_P4RUNTIME_COMMIT"
    for b in bmv2 dpdk p4test; do
        if has_backend "$b"; then flags+=("-DENABLE_${b^^}=ON"); else flags+=("-DENABLE_${b^^}=OFF"); fi
    done
    mkdir -p "$bld"
    # no other download (FetchContent fully disconnected; Debian's protobuf), no test registration
    # (it would look for simple_switch on PATH and then require scapy)
    step "p4c: configure" "$LOG/p4c-cmake.log" cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$PREFIX" "${flags[@]}" -DENABLE_EBPF=OFF -DENABLE_UBPF=OFF -DENABLE_P4TC=OFF \
        -DENABLE_P4C_GRAPHS=OFF -DENABLE_GTESTS=OFF -DENABLE_TEST_TOOLS=OFF -DENABLE_DOCS=OFF \
        -DCMAKE_DISABLE_FIND_PACKAGE_BMV2=ON -DP4C_USE_PREINSTALLED_PROTOBUF=ON \
        -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DFETCHCONTENT_SOURCE_DIR_P4RUNTIME="$WORK/p4c-p4runtime"
    step "p4c: build ($JOBS jobs)" "$LOG/p4c-make.log" cmake --build "$bld" -j "$JOBS"
    step "p4c: install" "$LOG/p4c-install.log" cmake --install "$bld"
    record p4c "$t0" "$c0" "p4lang/p4c $P4C_TAG ($P4C_COMMIT) backends=$P4C_BACKENDS p4runtime=$P4C_P4RUNTIME_COMMIT"
}

# ---- PI
build_pi() {
    local t0=$SECONDS c0 src=$WORK/PI path repo sub commit
    cpu_seconds; c0=$CPU
    checkout "$PI_REPO" "$PI_COMMIT" "$src"
    for sub in $PI_SUBMODULES; do
        path=${sub%%=*} repo=${sub#*=}
        commit=$(git -C "$src" ls-tree HEAD "$path" | awk '$2 == "commit" { print $3 }')
        [ -n "$commit" ] || die "PI $PI_COMMIT has no submodule at $path"
        checkout "$repo" "$commit" "$src/$path"
    done
    cd "$src"
    step "PI: autogen" "$LOG/pi-autogen.log" ./autogen.sh
    # the P4Runtime gRPC server only: no internal RPC, no CLI, no PI-on-bmv2 (bmv2 brings its own)
    step "PI: configure" "$LOG/pi-configure.log" ./configure --prefix="$PREFIX" --with-proto \
        --without-internal-rpc --without-cli --without-bmv2 --disable-static \
        CXXFLAGS="-O2" CFLAGS="-O2"
    step "PI: build ($JOBS jobs)" "$LOG/pi-make.log" make -j "$JOBS"
    step "PI: install" "$LOG/pi-install.log" make install
    cd - >/dev/null
    record pi "$t0" "$c0" "p4lang/PI $PI_COMMIT with $(for s in $PI_SUBMODULES; do
        printf '%s@%s ' "${s#*=}" "$(git -C "$src" ls-tree HEAD "${s%%=*}" | awk '{print substr($3,1,10)}')"; done)"
}

# ---- behavioral-model
build_bmv2() {
    local t0=$SECONDS c0 src=$WORK/behavioral-model bld=$WORK/behavioral-model/build flags=()
    cpu_seconds; c0=$CPU
    checkout "$BMV2_REPO" "$BMV2_COMMIT" "$src"
    if [ "$BMV2_FAST" = 1 ]; then
        flags=(-DCMAKE_BUILD_TYPE=Release -DENABLE_LOGGING_MACROS=OFF -DENABLE_ELOGGER=OFF)
    else
        flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
    fi
    mkdir -p "$bld"
    step "behavioral-model: configure" "$LOG/bmv2-cmake.log" cmake -S "$src" -B "$bld" \
        -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_INSTALL_RPATH="$PREFIX/lib" \
        -DCMAKE_REQUIRED_INCLUDES="$PREFIX/include" -DWITH_THRIFT=ON -DWITH_PI=ON -DWITH_NANOMSG=OFF \
        -DWITH_PDFIXED=OFF -DWITH_STRESS_TESTS=OFF -DENABLE_DEBUGGER=OFF "${flags[@]}"
    step "behavioral-model: build ($JOBS jobs)" "$LOG/bmv2-make.log" cmake --build "$bld" -j "$JOBS"
    step "behavioral-model: install" "$LOG/bmv2-install.log" cmake --install "$bld"
    record bmv2 "$t0" "$c0" "p4lang/behavioral-model $BMV2_TAG ($BMV2_COMMIT) thrift=on pi=on nanomsg=off fast=$BMV2_FAST flags=${flags[*]}"
}

has_part p4c && build_p4c
has_part pi && build_pi
has_part bmv2 && build_bmv2

write_buildinfo
rm -f "$WORK/.times"
if [ "$KEEP_WORK" = 0 ]; then rm -rf "$WORK"; fi
echo "build-p4tools: done; $PREFIX/BUILDINFO:"
cat "$PREFIX/BUILDINFO"
