# Shared by the GPU benchmark scripts (sourced, not run): the CUDA programs print
# `ms_per_launch=X` (CUDA events), and a row's figure is the median of $runs runs.

# The ms_per_launch values on stdin.
ms() { grep -o 'ms_per_launch=[0-9.]*' | cut -d= -f2; }

# The median of the numbers on stdin, one a line.
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# bench NAME CMD...: runs CMD $runs times (5 unless set) and prints NAME, the median ms per
# launch, its ratio to the latest row named `native` (which sets $base) and every run.
bench() {
    local name=$1
    shift
    local vals m ratio
    vals=$(for _ in $(seq "${runs:-5}"); do "$@" 2>/dev/null | ms; done)
    m=$(median <<<"$vals")
    [ "$name" = native ] && base=$m
    ratio=$(awk -v m="${m:-0}" -v b="${base:-0}" 'BEGIN { if (m > 0 && b > 0) printf "%.3fx", m / b; else print "-" }')
    echo "$name ${m:-FAIL} $ratio ($(echo $vals | tr '\n' ' '))"
}
