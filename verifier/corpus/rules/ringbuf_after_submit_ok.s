# the record is written before it is submitted
#@ type kprobe
#@ intent accept
#@ map rb ringbuf 0 0 4096
ldmap %r1, rb
mov %r2, 8
mov %r3, 0
call 131
jeq %r0, 0, out
mov %r6, %r0
stdw [%r6], 7
mov %r1, %r6
mov %r2, 0
call 132
out:
mov %r0, 0
exit
