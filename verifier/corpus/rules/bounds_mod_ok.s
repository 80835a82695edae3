# modulo leaves no bounds (as in the kernel); a mask after it bounds the index
#@ type kprobe
#@ intent accept
#@ map arr array 4 64 1
ldxdw %r6, [%r1+8]
mod %r6, 64
and %r6, 63
ldmapval %r1, arr, 0
add %r1, %r6
ldxb %r0, [%r1]
exit
