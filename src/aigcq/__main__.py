from aigcq.cli import main

main()
