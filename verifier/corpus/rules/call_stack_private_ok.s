# without tail calls a kprobe program's frames still share one stack (6.1 and
# 6.18 give it no private stacks): 3 x 160 bytes fit in 512
#@ type kprobe
#@ intent accept
stdw [%r10-160], 0
call local f
exit
f:
stdw [%r10-160], 0
call local g
exit
g:
stdw [%r10-160], 0
mov %r0, 0
exit
