#!/usr/bin/env bash
# The two DPDK headers the code of a generated SWX pipeline includes and Debian's libdpdk-dev does
# not ship (rte_swx_pipeline_internal.h, rte_swx_pipeline_spec.h), taken from Debian's source
# package of the INSTALLED DPDK version: `apt-get source --download-only dpdk=<version>` with a
# private sources list (deb-src lines for the suites the system already uses; the system's apt
# configuration is not changed), then only lib/pipeline/*.h are extracted. Run by
# scripts/install-deps.sh; the p4dpdk target (embnic.control.targets.p4dpdk.swx) compiles the pipeline with
# -I DIR. Nothing of DPDK is copied into the repository.
#
#   scripts/dpdk-pipeline-headers.sh [DIR]     default /var/cache/embnic/dpdk-<version>
# Prints DIR/lib/pipeline (where the headers are) on success. Idempotent.
set -euo pipefail
ver="$(dpkg-query -W -f='${Version}' libdpdk-dev 2>/dev/null || true)"
if [ -z "$ver" ]; then
    echo "embnic: libdpdk-dev is not installed (scripts/apt-packages.txt): no DPDK version to fetch headers for" >&2
    exit 1
fi
dir="${1:-/var/cache/embnic/dpdk-$ver}"
inc="$dir/lib/pipeline"
if [ -f "$inc/rte_swx_pipeline_internal.h" ] && [ -f "$inc/rte_swx_pipeline_spec.h" ]; then
    echo "$inc"; exit 0
fi
apt_dir="$dir/.apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/src"
# deb-src lines for every URI and suite of the system's own deb lines (one-line and deb822 formats)
{
    grep -hE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | sed -E 's/^\s*deb(\s+\[[^]]*\])?\s+/deb-src /' || true
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk 'BEGIN{RS=""; FS="\n"} {u="";s="";c="";t=""; for(i=1;i<=NF;i++){
                 if($i ~ /^Types:/) t=$i; if($i ~ /^URIs:/){u=$i; sub(/^URIs:[ \t]*/,"",u)}
                 if($i ~ /^Suites:/){s=$i; sub(/^Suites:[ \t]*/,"",s)}
                 if($i ~ /^Components:/){c=$i; sub(/^Components:[ \t]*/,"",c)}}
             if(t ~ /deb/ && u != "") { n=split(s, ss, /[ \t]+/); for(j=1;j<=n;j++) print "deb-src " u " " ss[j] " " c }}' "$f"
    done
} | sort -u > "$apt_dir/sources.list"
if ! [ -s "$apt_dir/sources.list" ]; then
    echo "embnic: no deb lines in /etc/apt to derive deb-src lines from" >&2; exit 1
fi
opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
      -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Sandbox::User=root")
apt-get "${opts[@]}" -qq update
(cd "$apt_dir/src" && apt-get "${opts[@]}" -qq source --download-only "dpdk=$ver")
orig="$(ls "$apt_dir"/src/dpdk_*.orig.tar.* 2>/dev/null | head -1)"
if [ -z "$orig" ]; then
    echo "embnic: apt-get source dpdk=$ver fetched no .orig tarball (see $apt_dir/src)" >&2; exit 1
fi
tmp="$(mktemp -d "$dir/.x.XXXXXX")"
tar -xf "$orig" -C "$tmp" --wildcards '*/lib/pipeline/*.h'
mkdir -p "$inc"
cp "$tmp"/*/lib/pipeline/*.h "$inc/"
rm -rf "$tmp" "$apt_dir"   # the source indexes and tarballs: only the headers are kept
echo "$inc"
