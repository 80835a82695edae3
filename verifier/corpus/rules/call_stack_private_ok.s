# without tail calls every frame has its own stack: 3 x 256 bytes are fine
#@ type kprobe
#@ intent accept
stdw [%r10-256], 0
call local f
exit
f:
stdw [%r10-256], 0
call local g
exit
g:
stdw [%r10-256], 0
mov %r0, 0
exit
