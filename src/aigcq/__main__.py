from aigcq.cli.entry import main

main()
