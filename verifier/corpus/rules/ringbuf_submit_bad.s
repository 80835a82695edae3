# a reserved record is never submitted nor discarded
#@ type kprobe
#@ intent reject
#@ map rb ringbuf 0 0 4096
ldmap %r1, rb
mov %r2, 16
mov %r3, 0
call 131
jeq %r0, 0, out
stdw [%r0], 1
out:
mov %r0, 0
exit
