# atomics go to the stack, not the context
#@ type kprobe
#@ intent accept
stdw [%r10-8], 0
mov %r2, 1
lock add [%r10-8], %r2
mov %r0, 0
exit
