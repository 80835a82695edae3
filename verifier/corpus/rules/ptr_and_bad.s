# masking a pointer
#@ type kprobe
#@ intent reject
mov %r2, %r10
and %r2, -8
mov %r0, 0
exit
