# a negated pointer is no longer a pointer
#@ type kprobe
#@ intent reject
mov %r2, %r10
neg %r2
neg %r2
stdw [%r2-8], 0
mov %r0, 0
exit
